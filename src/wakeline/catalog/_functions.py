"""Resolve ``module:function`` derivation callables from a catalog directory."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wakeline.catalog.errors import FunctionUnresolved

#: Catalog directories this process put on sys.path (only the latest one stays there).
_ADDED_ROOTS: set[str] = set()

FUNCTION_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _evict_foreign(module: str, root: Path) -> None:
    """Forget a cached top-level package that was imported from another catalog.

    Two catalogs may both ship a package named ``agent_memory``; without this the
    second would silently run the first one's code.
    """
    top = module.split(".")[0]
    cached = sys.modules.get(top)
    if cached is None:
        return
    origin = getattr(cached, "__file__", None)
    paths = [Path(p).resolve() for p in ([origin] if origin else getattr(cached, "__path__", []))]
    others = [Path(r) for r in _ADDED_ROOTS if Path(r) != root]
    if not any(p.is_relative_to(o) for p in paths for o in others):
        return  # from this catalog, or an installed/stdlib module: leave it alone
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def resolve_callable(root: str | Path, ref: str) -> Callable[..., Any]:
    """Import ``module:function`` with ``root`` on ``sys.path`` and return the callable."""
    if not FUNCTION_RE.match(ref):
        raise FunctionUnresolved(
            f"function {ref!r} is not 'module:function'; write e.g. 'agent_memory.profile:derive'",
            function=ref,
        )
    module_name, _, attr = ref.partition(":")
    root_path = Path(root).resolve()
    # Another catalog's directory must not shadow this one's modules.
    sys.path[:] = [p for p in sys.path if p not in _ADDED_ROOTS or p == str(root_path)]
    if str(root_path) not in sys.path:
        sys.path.insert(0, str(root_path))
        _ADDED_ROOTS.add(str(root_path))
    _evict_foreign(module_name, root_path)
    importlib.invalidate_caches()
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise FunctionUnresolved(
            f"cannot import module {module_name!r} for {ref!r} ({type(exc).__name__}: {exc}); "
            f"put {module_name.replace('.', '/')}.py under {root_path} or fix the module",
            function=ref,
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise FunctionUnresolved(
                f"module {module_name!r} has no attribute {attr!r}; define "
                f"`def {part}(ctx)` there or fix the name in `function:`",
                function=ref,
            ) from exc
    if not callable(obj):
        raise FunctionUnresolved(
            f"{ref!r} is not callable; point `function:` at a `def fn(ctx)`", function=ref
        )
    return obj  # type: ignore[no-any-return]
