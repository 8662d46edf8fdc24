# Cython declarations for outcomes.py (see state.pxd).

cdef class Outcome:
    cdef public object kind, reason, at, workspace, entity, derivation, trigger, detail
