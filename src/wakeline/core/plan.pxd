# Cython declarations for plan.py (see state.pxd): the per-record classes as
# extension types with object fields.

cdef class Rec:
    cdef public object seq, collection, version, type, status, key, content, text, tombstone
    cdef public object annotations, scores, enriched_at, created_at, parents

cdef class Fact:
    cdef public object seq, coll, key, tomb, active, digest, ready, arrived, created, drive, cond
