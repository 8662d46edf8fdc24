"""Build hooks that pyproject.toml cannot express: the C extensions.

- ``wakeline.core._ccodec``: the state codec's C accelerator.  It writes the same
  bytes as the pure-Python codec (the specification, and the fallback when no C
  compiler is at hand: the extension is optional, so an install never fails for want
  of one).  The test suite checks that it was built where CI runs
  (tests/unit/core/test_ccodec.py).
- The hot path's Python modules (``wakeline/_compiled.py`` lists them), compiled
  from their unchanged source by Cython when it is importable (pyproject's build
  requirements bring it).  Optional too: a module that fails to compile runs as
  source.  The SHA-256 of each compiled source goes to
  ``src/wakeline/_compiled_sources.json``, so a build older than its source is
  never imported (``wakeline._compiled.FreshSource``).
"""

import json
import os
import runpy
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"


def cython_extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    spec = runpy.run_path(str(SRC / "wakeline" / "_compiled.py"))
    modules = spec["MODULES"]
    paths = {m: Path("src", *m.split(".")).with_suffix(".py") for m in modules}
    exts = cythonize(
        [Extension(m, [str(paths[m])], optional=True) for m in modules],
        # annotations stay annotations: an `int` annotation must not become a C long
        compiler_directives={"language_level": 3, "annotation_typing": False,
                             "binding": True},
        build_dir="build/cython", quiet=True, nthreads=os.cpu_count() or 1)
    (SRC / "wakeline" / "_compiled_sources.json").write_text(json.dumps(
        {m: spec["source_digest"](ROOT / p) for m, p in paths.items()}, indent=1) + "\n")
    return exts


setup(ext_modules=[
    Extension("wakeline.core._ccodec", ["src/wakeline/core/_ccodec.c"],
              extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra",
                                  "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
              optional=True),
    *cython_extensions(),
])
