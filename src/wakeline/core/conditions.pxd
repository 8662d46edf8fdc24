# Cython declarations for conditions.py (see state.pxd); the cimports type the
# source's annotations of these classes.
from wakeline.core.plan cimport Fact, Rec
from wakeline.core.state cimport DState, EntityState, Job

cdef class Eval:
    cdef public object cond, holds, permitted, settle, kind, reason, value, detail, stimulus
