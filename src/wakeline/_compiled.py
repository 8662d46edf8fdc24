"""Which of Wakeline's modules are also built as C extensions by Cython, and the
import rule that keeps an edited source from being shadowed by a stale build.

The Python source *is* the module: at install time, when Cython is at hand
(pyproject's build requirements bring it), ``setup.py`` compiles the same files,
which hold nothing Cython-specific; without a build, the interpreter runs the
source.  Compiled, a conditions worker spends 12-16 % less CPU per record
(BENCHMARKS.md, "What each change bought").

An extension sits next to its source (``engine.cpython-311-x86_64-linux-gnu.so``
beside ``engine.py``) and Python's path finder prefers it.  Once the source is
edited, or a checkout changes it, that build is stale.  The build records each
source's SHA-256 in ``_compiled_sources.json`` (next to this file); :class:`FreshSource`
imports the source of a module whose file no longer matches, with one warning
naming the command that rebuilds (``make install``, or ``pip install -e .``).

``WAKELINE_PURE=1`` imports all of them from source: for profiling (py-spy sees no
frames inside compiled code) and for comparing the two.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: compiled when Cython is at hand: the conditions worker's hot path (the readiness
#: stage, the agent's batch, the core, the states, the outcome rows)
MODULES = (
    "wakeline.cdc._json",
    "wakeline.cdc.envelope",
    "wakeline.core.codec",
    "wakeline.core.conditions",
    "wakeline.core.engine",
    "wakeline.core.events",
    "wakeline.core.inputs",
    "wakeline.core.outcomes",
    "wakeline.core.plan",
    "wakeline.core.state",
    "wakeline.streams.batch",
    "wakeline.streams.delivery",
    "wakeline.streams.readiness",
    "wakeline.streams.ready",
    "wakeline.streams.sinks",
    "wakeline.streams.statestore",
    "wakeline.streams.timers",
)

#: what the build wrote: module -> SHA-256 of the source it compiled
SOURCES_FILE = Path(__file__).with_name("_compiled_sources.json")


def source_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class FreshSource(importlib.abc.MetaPathFinder):
    """Imports a listed module from its source when no build of that very source
    is present (or ``pure``); leaves every other import to the default finders."""

    def __init__(self, built: dict[str, str], pure: bool = False) -> None:
        self.built = built
        self.pure = pure
        self.stale: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path or ():
            source = os.path.join(entry, leaf + ".py")
            if not os.path.exists(source):
                continue
            if not any(os.path.exists(os.path.join(entry, leaf + suffix))
                       for suffix in importlib.machinery.EXTENSION_SUFFIXES):
                return None  # nothing compiled here: the source, as always
            if not self.pure:
                if self.built.get(fullname) == source_digest(source):
                    return None  # the build of this source: the default finder takes it
                self.stale.append(fullname)
                warnings.warn(
                    f"{fullname}: the compiled module was built from another version of "
                    f"{source}; running the source (slower). Rebuild with `make install` "
                    "(or `pip install -e .`).", RuntimeWarning, stacklevel=2)
            return importlib.util.spec_from_file_location(fullname, source)
        return None


def install() -> FreshSource:
    """Put :class:`FreshSource` first on ``sys.meta_path`` (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, FreshSource):
            return finder
    try:
        built = json.loads(SOURCES_FILE.read_text())
    except (OSError, ValueError):
        built = {}
    finder = FreshSource(built, pure=os.environ.get("WAKELINE_PURE") == "1")
    sys.meta_path.insert(0, finder)
    return finder


def compiled(module: Any) -> bool:
    """Whether ``module`` was loaded from a compiled extension."""
    origin = getattr(module, "__file__", "") or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
