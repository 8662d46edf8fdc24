"""Build hooks that pyproject.toml cannot express: the state codec's C accelerator.

``wakeline.core._ccodec`` writes the same bytes as the pure-Python codec (the
specification, and the fallback when no C compiler is at hand: the extension is
optional, so an install never fails for want of one).  The test suite checks that it
was built where CI runs (tests/unit/core/test_ccodec.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("wakeline.core._ccodec", ["src/wakeline/core/_ccodec.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra",
                                                 "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"],
                             optional=True)])
