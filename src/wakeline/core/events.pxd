# Cython declarations for events.py (see state.pxd).
from wakeline.core.plan cimport Rec

cdef class RecordChanged:
    cdef public object op, after, before, lsn
