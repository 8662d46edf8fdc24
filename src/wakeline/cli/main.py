"""Entry point of the ``wakeline`` console script.

Each command lives in its own module under ``wakeline.cli`` and exposes
``register(subparsers)``; that function adds its parser and sets ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from wakeline.errors import WakelineError

COMMANDS = ["up", "worker", "run", "api", "services", "db", "catalog", "cdc"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wakeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"wakeline.cli.{name}_cmd")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except WakelineError as exc:
        print(f"error[{exc.code}]: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
