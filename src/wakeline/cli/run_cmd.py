"""``wakeline run DERIVATION ENTITY [--run-after T]``: enqueue a manual run.

The request goes to the stimuli topic keyed by the entity, so it reaches the
entity's mailbox in order with everything else; it never waits for the run.
"""

from __future__ import annotations

import argparse

from confluent_kafka import Producer

from wakeline.catalog import compile_catalog
from wakeline.clock import parse_instant
from wakeline.errors import ConfigError
from wakeline.streams import stimuli
from wakeline.streams.keys import entity_key
from wakeline.topology import load_topology


def run(args: argparse.Namespace) -> int:
    from wakeline.cli.worker_cmd import _addresses

    topo = load_topology(args.topology)
    catalog = compile_catalog(args.catalog or topo.catalog)
    if args.derivation not in catalog.derivations:
        raise ConfigError(f"unknown derivation {args.derivation!r}; known: "
                          f"{', '.join(sorted(catalog.derivations))}")
    _, bootstrap = _addresses(args, topo)
    run_after = parse_instant(args.run_after).timestamp() if args.run_after else None
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    producer.produce(topo.topics.stimuli.name, key=entity_key(topo.workspace, args.entity),
                     value=stimuli.encode("manual", derivation=args.derivation,
                                          run_after=run_after))
    if producer.flush(30) != 0:
        raise ConfigError(f"the broker at {bootstrap} did not acknowledge the request")
    print(f"manual run of {args.derivation} for {args.entity} enqueued"
          + (f" (run_after {args.run_after})" if args.run_after else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="enqueue a manual run of a derivation for an entity")
    p.add_argument("derivation")
    p.add_argument("entity")
    p.add_argument("--run-after", default=None, help="ISO-8601 instant with a zone")
    p.add_argument("--topology", default="topologies/embedded.yaml")
    p.add_argument("--catalog", default=None)
    p.add_argument("--dsn", default=None)
    p.add_argument("--bootstrap", default=None)
    p.set_defaults(func=run)
