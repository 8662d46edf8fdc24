"""Turn pydantic validation errors into catalog issues with real YAML paths."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from wakeline.catalog._common import Reporter
from wakeline.catalog._yaml import join

_HINTS = {
    "on": "a changed condition's field is `transitions:`, not `on:` — rename it",
    "manual": "manual runs need no trigger: any derivation can be enqueued with "
    "POST /processors/<name>/run; remove `manual:`",
    "threshold": "thresholds belong inside `accumulator:` or `census:` — move it there",
    "metric": "`metric:` belongs inside `accumulator:` — move it there",
    "after_s": "`after_s:` belongs inside `quiet:` — move it there",
    "expr": "`expr:` belongs inside `cron:` — move it there",
    "where": "`where:` belongs inside a scoped condition (write, changed, retraction, quiet, "
    "at, census) — move it there",
    "trigger": "standalone trigger files hold the conditions at the top level — remove the "
    "`trigger:` level",
}


def _clean_loc(data: Any, loc: tuple[Any, ...]) -> tuple[list[str | int], Any]:
    """Drop pydantic's union-member tags from ``loc``; keep only real keys/indices."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif i == len(loc) - 1 and isinstance(node, dict):
            out.append(part)  # the missing/unknown key itself
            node = None
    return out, node


def _model_candidates(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _model_candidates(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(tp):
            out.extend(_model_candidates(arg))
        return out
    return [tp]


def _allowed_keys(model: type[BaseModel], parts: list[str | int]) -> list[str]:
    """The keys the model accepts at ``parts`` (the parent of an unknown key)."""
    current: list[Any] = [model]
    for part in parts:
        nxt: list[Any] = []
        for tp in current:
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                for name, info in tp.model_fields.items():
                    if (info.alias or name) == part:
                        nxt.extend(_model_candidates(info.annotation))
            elif origin in (list, dict):
                nxt.extend(_model_candidates(typing.get_args(tp)[-1]))
        current = nxt
    keys: list[str] = []
    for tp in current:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            keys.extend(info.alias or name for name, info in tp.model_fields.items())
    return sorted(set(keys))


def _path(parts: list[str | int]) -> str:
    path = ""
    for part in parts:
        path = join(path, part)
    return path


def report_validation_error(
    rep: Reporter, file: str, model: type[BaseModel], data: Any, exc: ValidationError
) -> None:
    seen: set[str] = set()
    for err in exc.errors():
        parts, _ = _clean_loc(data, tuple(err["loc"]))
        path = _path(parts)
        kind = err["type"]
        given = err.get("input")
        if kind == "extra_forbidden":
            key = str(parts[-1]) if parts else "?"
            allowed = _allowed_keys(model, parts[:-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = _HINTS.get(key) if key not in allowed else None
            if hint is None:
                hint = (f"did you mean `{close[0]}`? " if close else "") + "remove or rename it"
            rep.add(
                "schema.unknown_key", file, path,
                f"unknown key `{key}`: {hint} (allowed here: {', '.join(allowed)})",
            )
            continue
        if path in seen:
            continue
        seen.add(path)
        if kind == "missing":
            key = str(parts[-1]) if parts else "?"
            rep.add("schema.missing", file, path, f"missing required key `{key}`; add it")
        elif kind.startswith("literal"):
            rep.add(
                "schema.invalid", file, path,
                f"{err['msg']} (got {given!r}); use one of the listed values",
            )
        else:
            shown = repr(given)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            rep.add(
                "schema.invalid", file, path,
                f"{err['msg']} (got {type(given).__name__} {shown}); fix the value "
                "(quote strings, write numbers without quotes)",
            )
