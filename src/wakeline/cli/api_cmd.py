"""``wakeline api``: serve the HTTP API and the dashboard for a topology.

Tokens come from ``--config FILE`` (YAML: ``tokens: {workspace: token}``,
``operator_token``, …) and/or ``WAKELINE_API_TOKENS`` (see
:mod:`wakeline.api.config`).  Without any token no data endpoint can be used,
which the command says before it starts.
"""

from __future__ import annotations

import argparse
import sys

from wakeline.catalog import compile_catalog
from wakeline.clock import clock_from_env
from wakeline.topology import load_topology


def run(args: argparse.Namespace) -> int:
    from wakeline.api import ApiContext, ApiServer, load_settings
    from wakeline.cli.worker_cmd import _addresses

    topo = load_topology(args.topology)
    dsn, bootstrap = _addresses(args, topo)
    settings = load_settings(args.config)
    ctx = ApiContext(topo, compile_catalog(args.catalog or topo.catalog), dsn, bootstrap,
                     settings=settings, clock=clock_from_env(), app_id=args.app_id)
    server = ApiServer(ctx, args.host, args.port)
    if not settings.tokens:
        print("warning: no workspace tokens configured (--config or WAKELINE_API_TOKENS): "
              "every data endpoint will answer 401", file=sys.stderr)
    print(f"api       {server.url}  (OpenAPI {server.url}/docs, dashboard "
          f"{server.url}/dashboard)", flush=True)
    try:
        server.serve()
    finally:
        ctx.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("api", help="serve the HTTP API and the lag dashboard")
    p.add_argument("--topology", default="topologies/embedded.yaml")
    p.add_argument("--catalog", default=None)
    p.add_argument("--dsn", default=None)
    p.add_argument("--bootstrap", default=None)
    p.add_argument("--app-id", default=None,
                   help="the workers' app id (default wakeline-<topology>)")
    p.add_argument("--config", default=None, help="YAML file with tokens and API settings")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=run)
