# Cython declarations for state.py (the source stays plain Python): compiled, these
# classes are extension types whose fields are struct members, so typed code of the
# core reads them without a lookup through the type.  Every field is a Python object:
# the values (big ints, None, floats) are exactly what the source puts there.
#
# The .py marks each class ``@cython.no_gc`` (Cython reads that directive only there):
# these objects are outside the cyclic GC.  They never form a reference cycle (a state
# is a tree, decoded from bytes or built by the engine, and no per-record object refers
# back to what holds it: tests/unit/test_compiled.py checks a workload for cycles), so
# the collector had nothing to find in them, only a conditions batch's worth to scan.

cdef class Job:
    cdef public object id, reasons, created, settle, dedupe, dispatched

cdef class DState:
    cdef public object w, last_success, handled, last_run, total, queued, running, dead
    cdef public object jobs_made, cron_last, waiting_on

cdef class EntityState:
    cdef public object workspace, entity, facts, unready, ds, census_base, alerted, last_lsn
    cpdef DState d(self, name)
