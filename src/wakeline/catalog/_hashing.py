"""The base of normalized models and their semantic hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class Norm(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Fields that do not change meaning and are left out of semantic hashes.
    _non_semantic: ClassVar[frozenset[str]] = frozenset(
        {"hash", "file", "description", "yaml_path"}
    )

    def semantic(self) -> Any:
        """The canonical JSON-able form of this definition (what its hash covers)."""
        return _semantic(self)


def _semantic(value: Any) -> Any:
    if isinstance(value, Norm):
        return {
            name: _semantic(getattr(value, name))
            for name in type(value).model_fields
            if name not in value._non_semantic
        }
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _semantic(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_semantic(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def semantic_hash(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value`` (a Norm or plain JSON data)."""
    data = _semantic(value)
    return "sha256:" + hashlib.sha256(canonical_json(data).encode()).hexdigest()
