"""Which of Wakeline's modules are also built as C extensions by Cython, and the
import rule that keeps an edited source from being shadowed by a stale build.

The Python source *is* the module: at install time, when Cython is at hand
(pyproject's build requirements bring it), ``setup.py`` compiles the same files;
without a build, the interpreter runs the source.  Compiled, a conditions worker
spent 12-16 % less CPU per record than the source, and the extension types below took
about a seventh off on Tansu, with mixed results on Kafka (BENCHMARKS.md, "What each change
bought"); in process the condition core runs 1.65-1.70x as fast as its source.

The core's per-record classes (:data:`DECLARED`) are dataclasses in the source and,
compiled, extension types: a ``.pxd`` beside each of those modules declares their
fields as struct members (Cython's "augmenting .pxd"), and ``engine.py`` and
``conditions.py`` are compiled with ``annotation_typing`` (a ``# cython:`` comment on
their first line), so their annotations of those classes type the code: a field is
read from the struct instead of through a lookup on the type.  Those modules are built
against each other's declarations, so they are fresh or stale together.

An extension sits next to its source (``engine.cpython-311-x86_64-linux-gnu.so``
beside ``engine.py``) and Python's path finder prefers it.  Once the source is
edited, or a checkout changes it, that build is stale.  The build records each
source's SHA-256 (with its ``.pxd``, if any) in ``_compiled_sources.json`` (next to this
file); :class:`FreshSource` imports the source of a module whose files no longer match
(for one of :data:`DECLARED`, all of them), with one warning naming the command that
rebuilds (``make install``, or ``pip install -e .``).

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

#: the modules whose classes are extension types when compiled (a ``.pxd`` beside each
#: declares them), built against each other's declarations: a compiled engine cannot
#: import the source's dataclasses, so one stale module makes all of them run as source
DECLARED = (
    "wakeline.core.conditions",
    "wakeline.core.engine",
    "wakeline.core.events",
    "wakeline.core.outcomes",
    "wakeline.core.plan",
    "wakeline.core.state",
)

#: what the build wrote: module -> SHA-256 of the source it compiled
SOURCES_FILE = Path(__file__).with_name("_compiled_sources.json")


def source_digest(path: str | Path) -> str:
    """SHA-256 of a module's source and, when there is one, its ``.pxd``."""
    path = Path(path)
    h = hashlib.sha256(path.read_bytes())
    pxd = path.with_suffix(".pxd")
    if pxd.exists():
        h.update(b"\0pxd\0" + pxd.read_bytes())
    return h.hexdigest()


class FreshSource(importlib.abc.MetaPathFinder):
    """Imports a listed module from its source when no build of that very source
    is present (or ``pure``); leaves every other import to the default finders."""

    def __init__(self, built: dict[str, str], pure: bool = False) -> None:
        self.built = built
        self.pure = pure
        self.stale: list[str] = []
        #: per package directory, the first stale one of DECLARED (None: all fresh), read
        #: once: each of the six imports asks
        self._declared: dict[str, str | None] = {}

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
                    if fullname not in DECLARED or not (stale := self._declared_stale(entry)):
                        return None  # the build of this source: the default finder takes it
                    why = f"{stale} was edited since the build, and they share declarations"
                else:
                    why = f"the compiled module was built from another version of {source}"
                self.stale.append(fullname)
                warnings.warn(
                    f"{fullname}: {why}; running the source (slower). Rebuild with "
                    "`make install` (or `pip install -e .`).", RuntimeWarning, stacklevel=2)
            return importlib.util.spec_from_file_location(fullname, source)
        return None

    def _declared_stale(self, directory: str) -> str | None:
        """The first of :data:`DECLARED` (all in one package directory) whose build does
        not match its files, if any."""
        if directory not in self._declared:
            sources = {name: os.path.join(directory, name.rpartition(".")[2] + ".py")
                       for name in DECLARED}
            self._declared[directory] = next((
                name for name, source in sources.items()
                if os.path.exists(source) and self.built.get(name) != source_digest(source)),
                None)
        return self._declared[directory]


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
