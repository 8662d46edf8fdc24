"""Cython's pure-mode decorators the core's modules use, for an install without Cython.

Compiled, ``import cython`` in a module is Cython's own: ``@cython.cclass`` with
``@cython.no_gc`` makes a class declared in the module's ``.pxd`` an extension type
outside the cyclic garbage collector.  Run as source (``WAKELINE_PURE=1``, or no
Cython installed) they leave the class as it is, as Cython's own shadow module does.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def cclass(cls: T) -> T:
    return cls


no_gc = cclass
