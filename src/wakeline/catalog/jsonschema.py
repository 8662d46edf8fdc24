"""JSON Schema of the catalog documents, for editors (yaml-language-server & co).

``document_schemas()`` returns one schema per document kind — ``collection``,
``derivation``, ``trigger`` — generated from the pydantic models, so editors flag
unknown keys and wrong types while typing.  Cross-references and seed rules are
checked by ``wakeline catalog check``, not by the schema.

Use in a YAML file::

    # yaml-language-server: $schema=./.schemas/trigger.schema.json
"""

from __future__ import annotations

from typing import Any

from wakeline.catalog.schema import DOCUMENT_KINDS

__all__ = ["document_schema", "document_schemas"]

_TITLES = {
    "collection": "Wakeline collection (collections/<name>.yaml)",
    "derivation": "Wakeline derivation (derivations/<name>.yaml)",
    "trigger": "Wakeline standalone trigger (triggers/<name>.yaml)",
}


def document_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one document kind."""
    try:
        model = DOCUMENT_KINDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown document kind {kind!r}; choose one of {', '.join(DOCUMENT_KINDS)}"
        ) from None
    schema = model.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": _TITLES[kind],
    }


def document_schemas() -> dict[str, dict[str, Any]]:
    return {kind: document_schema(kind) for kind in DOCUMENT_KINDS}
