"""The hot path's modules compiled by Cython (wakeline/_compiled.py, setup.py): built
where CI runs, never imported when older than their source, and the same answers
as their source."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from wakeline import _compiled
from wakeline._compiled import MODULES, FreshSource, source_digest

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def tree(tmp_path: Path, built: bool, name: str = "core") -> Path:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "engine.py").write_text("X = 1\n")
    if built:
        (pkg / f"engine{SUFFIX}").write_bytes(b"\x7fELF not loaded by this test")
    return pkg


def test_a_build_of_this_very_source_is_left_to_the_default_finder(tmp_path):
    pkg = tree(tmp_path, built=True)
    finder = FreshSource({"wakeline.core.engine": source_digest(pkg / "engine.py")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert finder.find_spec("wakeline.core.engine", [str(pkg)]) is None
    assert finder.stale == []


def test_a_build_of_another_source_is_skipped_with_a_warning_naming_the_fix(tmp_path):
    pkg = tree(tmp_path, built=True)
    finder = FreshSource({"wakeline.core.engine": source_digest(pkg / "engine.py")})
    (pkg / "engine.py").write_text("X = 2\n")  # edited after the build
    with pytest.warns(RuntimeWarning, match=r"built from another version.*make install"):
        spec = finder.find_spec("wakeline.core.engine", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "engine.py")
    assert finder.stale == ["wakeline.core.engine"]
    # never built (no digest recorded) counts as another version
    with pytest.warns(RuntimeWarning):
        assert FreshSource({}).find_spec("wakeline.core.engine", [str(pkg)]) is not None


def test_an_edited_pxd_makes_its_build_stale(tmp_path):
    pkg = tree(tmp_path, built=True)
    (pkg / "engine.pxd").write_text("cdef class Step:\n    cdef public object state\n")
    finder = FreshSource({"wakeline.core.engine": source_digest(pkg / "engine.py")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert finder.find_spec("wakeline.core.engine", [str(pkg)]) is None
    (pkg / "engine.pxd").write_text("cdef class Step:\n    cdef public object state, job\n")
    with pytest.warns(RuntimeWarning, match="built from another version"):
        assert finder.find_spec("wakeline.core.engine", [str(pkg)]) is not None


def test_the_declared_modules_run_as_source_together(tmp_path):
    """A compiled engine imports the extension types of the compiled state module: once
    one of them is stale, every one runs as source (the others are not touched)."""
    pkg = tmp_path / "core"
    pkg.mkdir()
    for name in [*_compiled.DECLARED, "wakeline.core.codec"]:
        leaf = name.rpartition(".")[2]
        (pkg / f"{leaf}.py").write_text(f"NAME = {leaf!r}\n")
        (pkg / f"{leaf}{SUFFIX}").write_bytes(b"\x7fELF not loaded by this test")
    built = {name: source_digest(pkg / (name.rpartition(".")[2] + ".py"))
             for name in [*_compiled.DECLARED, "wakeline.core.codec"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FreshSource(built).find_spec("wakeline.core.engine", [str(pkg)]) is None
    (pkg / "state.py").write_text("NAME = 'edited'\n")
    finder = FreshSource(built)
    with pytest.warns(RuntimeWarning, match=r"wakeline.core.state was edited.*make install"):
        spec = finder.find_spec("wakeline.core.engine", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "engine.py")
    with pytest.warns(RuntimeWarning, match="another version"):
        assert finder.find_spec("wakeline.core.state", [str(pkg)]) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert finder.find_spec("wakeline.core.codec", [str(pkg)]) is None
    assert finder.stale == ["wakeline.core.engine", "wakeline.core.state"]


def test_pure_imports_the_source_and_unlisted_or_unbuilt_modules_are_untouched(tmp_path):
    pkg = tree(tmp_path, built=True)
    digest = {"wakeline.core.engine": source_digest(pkg / "engine.py")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = FreshSource(digest, pure=True).find_spec("wakeline.core.engine", [str(pkg)])
    assert spec is not None and spec.origin == str(pkg / "engine.py")
    assert FreshSource({}).find_spec("wakeline.core.other", [str(pkg)]) is None
    unbuilt = tree(tmp_path, built=False, name="unbuilt")
    assert FreshSource({}).find_spec("wakeline.core.engine", [str(unbuilt)]) is None


def test_install_puts_one_finder_first():
    finder = _compiled.install()
    assert _compiled.install() is finder
    assert sum(isinstance(f, FreshSource) for f in sys.meta_path) == 1
    assert sys.meta_path.index(finder) < next(
        i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder)


def test_every_listed_module_is_compiled_where_ci_runs_and_none_is_stale():
    if not os.environ.get("CI") and not _compiled.SOURCES_FILE.exists():
        pytest.skip("not built here (no Cython at install time)")
    mods = {name: importlib.import_module(name) for name in MODULES}
    finder = _compiled.install()
    assert finder.stale == [], f"stale builds: {finder.stale}; run `make install`"
    if os.environ.get("WAKELINE_PURE") != "1":
        assert [n for n, m in mods.items() if not _compiled.compiled(m)] == []


SCRIPT = r"""
import hashlib, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "bench")
import core_throughput as ct
from wakeline import _compiled
from wakeline.core import codec, engine
with tempfile.TemporaryDirectory() as tmp:
    _, jobs, states = ct.run_core(ct.workload(300, 4000), ct.write_catalog(Path(tmp)))
h = hashlib.sha256()
for key in sorted(states):
    h.update(key.encode()); h.update(codec.encode_state(states[key]))
print(json.dumps({"jobs": jobs, "states": h.hexdigest(),
                  "compiled": _compiled.compiled(engine)}))
"""


def test_compiled_and_source_give_the_same_jobs_and_states():
    def run(pure: bool) -> dict:
        env = {**os.environ, "WAKELINE_PURE": "1" if pure else "0"}
        out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])

    source, built = run(True), run(False)
    assert source["compiled"] is False
    if os.environ.get("CI"):
        assert built["compiled"] is True
    assert source["jobs"] > 0
    assert (source["jobs"], source["states"]) == (built["jobs"], built["states"])


#: the core's per-record classes marked ``@cython.no_gc``, by module of wakeline.core
NO_GC = {"state": ("Job", "DState", "EntityState"), "plan": ("Rec", "Fact"),
         "events": ("RecordChanged",), "outcomes": ("Outcome",), "conditions": ("Eval",),
         "engine": ("JobInfo", "Step")}


def test_the_core_per_record_classes_are_outside_the_cyclic_gc_when_compiled():
    """Compiled, the states and per-record objects are extension types without the GC
    flag (``@cython.no_gc``): a conditions batch's states and outcomes are not scanned
    by each young collection.  Source, they are ordinary slotted classes."""
    import gc

    from wakeline.core import codec, plan, state

    compiled = _compiled.compiled(state)
    if os.environ.get("CI") and os.environ.get("WAKELINE_PURE") != "1":
        assert compiled
    classes = [getattr(importlib.import_module(f"wakeline.core.{mod}"), name)
               for mod, names in NO_GC.items() for name in names]
    gc_flag = 1 << 14  # Py_TPFLAGS_HAVE_GC
    assert {c.__name__: bool(c.__flags__ & gc_flag) for c in classes} == {
        c.__name__: not compiled for c in classes}
    job = state.Job("j", {"r": 1.0}, 1.0)
    fact = plan.Fact(1, "c", None, False, True, "d", True, None, 1.0, (), {})
    st = codec.decode_state(codec.encode_state(state.EntityState(
        "w", "e", facts={1: fact}, ds={"d": state.DState(w=3, queued=job)})), "w", "e")
    assert [gc.is_tracked(o) for o in (st, st.ds["d"], st.ds["d"].queued, st.facts[1])] == [
        not compiled] * 4


CYCLES = r"""
import gc, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "bench")
import core_throughput as ct
from wakeline import _compiled
from wakeline.core import engine
assert not _compiled.compiled(engine)
gc.disable()
with tempfile.TemporaryDirectory() as tmp:
    _, jobs, states = ct.run_core(ct.workload(300, 4000), ct.write_catalog(Path(tmp)))
del states
gc.set_debug(gc.DEBUG_SAVEALL)
gc.collect()
names = set(json.loads(sys.argv[1]))
print(json.dumps({"jobs": jobs, "garbage": len(gc.garbage),
                  "core": sorted({type(o).__name__ for o in gc.garbage
                                  if type(o).__name__ in names})}))
"""


def test_the_core_forms_no_reference_cycles_through_its_per_record_objects():
    """What ``@cython.no_gc`` relies on: run as source (where these classes are GC
    types), applying a workload leaves no cycle through a state, fact, job, outcome
    or step for the collector to find; compiled, such a cycle would never be freed."""
    env = {**os.environ, "WAKELINE_PURE": "1"}
    names = json.dumps([name for group in NO_GC.values() for name in group])
    out = subprocess.run([sys.executable, "-c", CYCLES, names], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=300)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["jobs"] > 0
    assert found["core"] == []


def test_the_engine_reads_its_own_attributes_from_its_struct_when_compiled(tmp_path):
    """``Engine`` is declared in ``engine.pxd``: compiled, its attributes are members
    (the core's methods read ``self.plan``, ``self._evaluators``, … without a dict
    lookup), and an instance still takes other attributes (a test replaces ``apply``
    on one engine)."""
    from tests.unit.core.helpers import catalog_dir, derivation
    from wakeline.catalog import compile_catalog
    from wakeline.core import engine
    from wakeline.core.build import build_plan

    compiled = _compiled.compiled(engine)
    if os.environ.get("CI") and os.environ.get("WAKELINE_PURE") != "1":
        assert compiled
    members = ("plan", "_names", "_evaluators", "_ticked", "unready_alert_s", "paused", "_at")
    assert {m: type(vars(engine.Engine).get(m)).__name__ == "getset_descriptor"
            for m in members} == dict.fromkeys(members, compiled)
    eng = engine.Engine(build_plan(compile_catalog(
        catalog_dir(tmp_path, {"w": derivation("w", "write: {}")}))))
    assert eng.plan.derivations["w"].name == "w"
    eng.note = "kept"
    assert eng.note == "kept"
