"""``wakeline catalog check|show|schema`` — thin wrappers over :mod:`wakeline.catalog`.

Exit status: 0 when the catalog is valid; 1 when ``check`` found issues (each printed
as ``file:path: [code] message``); 2 for any other Wakeline error (``show`` on an
invalid catalog, a missing directory), printed by the entry point as
``error[<code>]: message``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from wakeline.catalog import check_catalog, compile_catalog, document_schema, document_schemas
from wakeline.catalog.schema import CONDITION_KINDS, DOCUMENT_KINDS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "catalog", help="check, show or export the schema of a trigger catalog",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="catalog_command", required=True)

    check = sub.add_parser("check", help="validate a catalog; print every issue")
    check.add_argument("directory", type=Path, help="the catalog directory")
    check.add_argument(
        "--no-import", dest="resolve_functions", action="store_false",
        help="do not import derivation callables (only check the module:function syntax)",
    )
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.set_defaults(func=cmd_check)

    show = sub.add_parser("show", help="print the normalized catalog as JSON")
    show.add_argument("directory", type=Path, help="the catalog directory")
    show.add_argument(
        "--trigger", action="append", default=None, metavar="NAME",
        help="print only these triggers (repeatable)",
    )
    show.set_defaults(func=cmd_show)

    schema = sub.add_parser("schema", help="print the JSON Schema of the catalog documents")
    schema.add_argument(
        "--kind", choices=sorted(DOCUMENT_KINDS), default=None,
        help="one document kind (default: all, as {kind: schema})",
    )
    schema.add_argument(
        "--out", type=Path, default=None, metavar="DIR",
        help="write <kind>.schema.json files into DIR instead of printing",
    )
    schema.set_defaults(func=cmd_schema)


def cmd_check(args: argparse.Namespace) -> int:
    result = check_catalog(args.directory, resolve_functions=args.resolve_functions)
    if args.json:
        print(json.dumps({
            "ok": result.ok,
            "hash": result.catalog.hash if result.catalog else None,
            "issues": [i.to_dict() for i in result.issues],
            "warnings": [w.to_dict() for w in result.warnings],
        }, indent=2))
        return 0 if result.ok else 1
    for warning in result.warnings:
        print(f"warning: {warning.format()}")
    if result.catalog is None:
        for issue in result.issues:
            print(issue.format())
        n = len(result.issues)
        print(f"{args.directory}: {n} issue{'s' if n != 1 else ''}; catalog is invalid",
              file=sys.stderr)
        return 1
    cat = result.catalog
    kinds = sorted({k for t in cat.triggers.values() for k in t.kinds},
                   key=CONDITION_KINDS.index)
    print(
        f"OK {args.directory}: {len(cat.collections)} collections, {len(cat.derivations)} "
        f"derivations, {len(cat.triggers)} triggers ({', '.join(kinds) or 'no conditions'}); "
        f"hash {cat.hash}"
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    catalog = compile_catalog(args.directory)
    data = catalog.to_dict()
    if args.trigger:
        missing = [t for t in args.trigger if t not in data["triggers"]]
        if missing:
            print(f"unknown trigger(s): {', '.join(missing)}; known: "
                  f"{', '.join(data['triggers'])}", file=sys.stderr)
            return 1
        data = {"triggers": {t: data["triggers"][t] for t in args.trigger}}
    print(json.dumps(data, indent=2, ensure_ascii=False))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    schemas = document_schemas() if args.kind is None else {args.kind: document_schema(args.kind)}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for kind, schema in schemas.items():
            path = args.out / f"{kind}.schema.json"
            path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
            print(path)
        return 0
    print(json.dumps(schemas if args.kind is None else schemas[args.kind], indent=2))
    return 0
