# Cython declarations for engine.py (see state.pxd); the cimports type the source's
# annotations of these classes.
from wakeline.core.conditions cimport Eval
from wakeline.core.events cimport RecordChanged
from wakeline.core.outcomes cimport Outcome
from wakeline.core.plan cimport Fact, Rec
from wakeline.core.state cimport DState, EntityState, Job

cdef class JobInfo:
    cdef public object job_id, coalesced, run_after, derivation, entity

cdef class Step:
    cdef public EntityState state
    cdef public object outcomes, dispatched, merged, freshness, job, duplicate, reload

cdef class Engine:
    cdef public object plan, _names, _evaluators, _ticked, unready_alert_s, paused, _at
    cdef dict __dict__  # a test replaces a method of one instance
