/* The state codec in C: the same bytes and states as wakeline/core/codec.py's _Writer and
 * _Reader; the ready batch's item decoder (wakeline/streams/ready.py's decode); and the
 * parser of the common records change envelope (wakeline/cdc/envelope.py's parse).
 *
 * codec.py is the specification.  This module writes the version-1 body of an
 * EntityState (the V1 byte, the mask, the sections) for the shapes the core makes:
 * exact builtin types and the core's own classes.  For anything else it returns None
 * and the caller encodes with the Python writer, which also raises the errors a bad
 * state deserves; the reader likewise returns None for bytes codec.py must read (it says
 * what is wrong with corrupt ones).  Deflating stays in Python.  The differential tests
 * (tests/unit/core/test_ccodec.py, tests/unit/test_ready_c.py,
 * tests/unit/cdc/test_envelope_c.py) hold the two sides to the same bytes and objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* value tags, as in codec.py */
#define TG_NONE 0x80
#define TG_FALSE 0x81
#define TG_TRUE 0x82
#define TG_UINT 0x83
#define TG_NINT 0x84
#define TG_FINT 0x85
#define TG_FDELTA 0x86
#define TG_F64 0x87
#define TG_FSAME 0x88
#define TG_STR 0x89
#define TG_SREF 0x8A
#define TG_LIST 0x8B
#define TG_TUPLE 0x8C
#define TG_DICT 0x8D
#define TG_HEX 0x8E
#define TUPS 16

#define F_TOMB 1
#define F_ACTIVE 2
#define F_READY 4
#define F_KEY 8
#define F_DIGEST 16
#define F_ARR_NONE 32
#define F_ARR_OWN 64
#define F_RAW 128

#define S_FACTS 1
#define S_UNREADY 2
#define S_DS 4
#define S_CENSUS 8
#define S_ALERTED 16
#define S_LSN 32
#define S_IDENT 64

#define J_SETTLE 1
#define J_DEDUPE 2
#define J_DISPATCHED 4
#define J_ID_N 8

#define V1 0x01

/* w_* return 0 when written, -1 on an error (exception set), 1 when the value is not
 * one this writer handles (no exception: the caller falls back to codec.py). */
#define FALLBACK 1
#define TRY(x)                 \
    do {                       \
        int rc_ = (x);         \
        if (rc_) return rc_;   \
    } while (0)

static PyTypeObject *FactType, *DStateType, *EntityStateType, *JobType;

static PyObject *s_to_bytes, *s_little, *s_bit_length;

typedef struct {
    unsigned char *buf;
    Py_ssize_t len, cap;
    /* strings seen, in order (their index is the back reference), with an open-addressing
     * index over them; the tuples of ints remembered (at most TUPS) */
    PyObject **sv;
    Py_hash_t *sh;
    Py_ssize_t sn, scap;
    int32_t *slots;
    Py_ssize_t nslots;
    PyObject *tv[TUPS];
    Py_hash_t th[TUPS];
    int tn;
    PyObject *sv0[16];
    Py_hash_t sh0[16];
    int32_t slots0[32];
    int has_fbits;
    int64_t fbits;
    int64_t reg;
    PyObject *ws, *ent;
} W;

static int grow(W *w, Py_ssize_t n) {
    if (w->len + n <= w->cap) return 0;
    Py_ssize_t cap = w->cap * 2;
    if (cap < w->len + n) cap = w->len + n + 64;
    unsigned char *b = PyMem_Realloc(w->buf, cap);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    w->buf = b;
    w->cap = cap;
    return 0;
}

static inline int put(W *w, unsigned char c) {
    if (w->len >= w->cap && grow(w, 1)) return -1;
    w->buf[w->len++] = c;
    return 0;
}

static int put_bytes(W *w, const void *p, Py_ssize_t n) {
    if (grow(w, n)) return -1;
    memcpy(w->buf + w->len, p, n);
    w->len += n;
    return 0;
}

static int uvar(W *w, uint64_t n) {
    if (grow(w, 10)) return -1;
    while (n > 0x7F) {
        w->buf[w->len++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    w->buf[w->len++] = (unsigned char)n;
    return 0;
}

/* uvar of a non-negative int of any size */
static int uvar_big(W *w, PyObject *n) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (!overflow) return uvar(w, (uint64_t)x);
    PyObject *bl = PyObject_CallMethodNoArgs(n, s_bit_length);
    if (!bl) return -1;
    Py_ssize_t nbits = PyLong_AsSsize_t(bl);
    Py_DECREF(bl);
    if (nbits < 0) return -1;
    Py_ssize_t nbytes = (nbits + 7) / 8;
    PyObject *args = Py_BuildValue("(nO)", nbytes, s_little);
    if (!args) return -1;
    PyObject *meth = PyObject_GetAttr(n, s_to_bytes);
    PyObject *raw = meth ? PyObject_Call(meth, args, NULL) : NULL;
    Py_XDECREF(meth);
    Py_DECREF(args);
    if (!raw) return -1;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t groups = (nbits + 6) / 7;
    int rc = grow(w, groups);
    for (Py_ssize_t g = 0; rc == 0 && g < groups; g++) {
        Py_ssize_t bit = g * 7;
        unsigned v = 0;
        for (int i = 0; i < 7; i++, bit++) {
            if (bit < nbits && (p[bit >> 3] >> (bit & 7)) & 1) v |= 1u << i;
        }
        w->buf[w->len++] = (unsigned char)(g + 1 < groups ? v | 0x80 : v);
    }
    Py_DECREF(raw);
    return rc;
}

static int w_val(W *w, PyObject *v);

static int w_int64(W *w, int64_t x) {
    if (x >= 0 && x < 64) return put(w, (unsigned char)x);
    if (x >= 64) {
        TRY(put(w, TG_UINT));
        return uvar(w, (uint64_t)x - 64);
    }
    TRY(put(w, TG_NINT));
    return uvar(w, (uint64_t)(-1 - x));
}

static int w_int(W *w, PyObject *v) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (!overflow) return w_int64(w, x);
    PyObject *d;
    if (overflow > 0) {
        TRY(put(w, TG_UINT));
        PyObject *k = PyLong_FromLong(64);
        if (!k) return -1;
        d = PyNumber_Subtract(v, k);
        Py_DECREF(k);
    } else {
        TRY(put(w, TG_NINT));
        PyObject *neg = PyNumber_Negative(v);
        if (!neg) return -1;
        PyObject *one = PyLong_FromLong(1);
        d = one ? PyNumber_Subtract(neg, one) : NULL;
        Py_XDECREF(one);
        Py_DECREF(neg);
    }
    if (!d) return -1;
    int rc = uvar_big(w, d);
    Py_DECREF(d);
    return rc;
}

static int w_flt(W *w, double v) {
    const double max_exact = 9007199254740992.0; /* 2 ** 53 */
    if (isfinite(v) && v == floor(v) && -max_exact < v && v < max_exact &&
        (v != 0 || !signbit(v))) {
        TRY(put(w, TG_FINT));
        int64_t i = (int64_t)v;
        return uvar(w, i >= 0 ? (uint64_t)i << 1 : ((uint64_t)(-i) << 1) - 1);
    }
    int64_t bits;
    memcpy(&bits, &v, 8);
    int had = w->has_fbits;
    int64_t prev = w->fbits;
    w->fbits = bits;
    w->has_fbits = 1;
    if (had) {
        if (bits == prev) return put(w, TG_FSAME);
        __int128 d = (__int128)bits - (__int128)prev;
        unsigned __int128 z = d >= 0 ? (unsigned __int128)d << 1
                                     : ((unsigned __int128)(-d) << 1) - 1;
        if (z < ((unsigned __int128)1 << 49)) {
            TRY(put(w, TG_FDELTA));
            return uvar(w, (uint64_t)z);
        }
    }
    TRY(put(w, TG_F64));
    unsigned char le[8];
    uint64_t u = (uint64_t)bits;
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(u >> (8 * i));
    return put_bytes(w, le, 8);
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The index of string v among those written, or -1 after remembering it as the next one
 * (codec.py's strs dict), or -2 on an error. */
static Py_ssize_t str_index(W *w, PyObject *v) {
    Py_hash_t h = PyObject_Hash(v);
    if (h == -1) return -2;
    size_t mask = (size_t)w->nslots - 1, j = (size_t)h & mask;
    for (;; j = (j + 1) & mask) {
        int32_t k = w->slots[j];
        if (k < 0) break;
        if (w->sh[k] != h) continue;
        PyObject *o = w->sv[k];
        if (o == v) return k;
        int eq = PyUnicode_Compare(o, v);
        if (eq == -1 && PyErr_Occurred()) return -2;
        if (eq == 0) return k;
    }
    if (w->sn == w->scap) { /* grow the list */
        Py_ssize_t cap = w->scap * 2;
        PyObject **sv = PyMem_Malloc(cap * sizeof(PyObject *));
        Py_hash_t *sh = PyMem_Malloc(cap * sizeof(Py_hash_t));
        if (!sv || !sh) {
            PyMem_Free(sv);
            PyMem_Free(sh);
            PyErr_NoMemory();
            return -2;
        }
        memcpy(sv, w->sv, w->sn * sizeof(PyObject *));
        memcpy(sh, w->sh, w->sn * sizeof(Py_hash_t));
        if (w->sv != w->sv0) {
            PyMem_Free(w->sv);
            PyMem_Free(w->sh);
        }
        w->sv = sv;
        w->sh = sh;
        w->scap = cap;
    }
    Py_ssize_t k = w->sn++;
    w->sv[k] = v; /* borrowed: the state holds it while the writer lives */
    w->sh[k] = h;
    if (w->sn * 2 > w->nslots) { /* rebuild the index at twice the size */
        Py_ssize_t ns = w->nslots * 2;
        int32_t *slots = PyMem_Malloc(ns * sizeof(int32_t));
        if (!slots) {
            PyErr_NoMemory();
            return -2;
        }
        memset(slots, 0xff, ns * sizeof(int32_t));
        for (Py_ssize_t q = 0; q < w->sn; q++) {
            size_t p = (size_t)w->sh[q] & (size_t)(ns - 1);
            while (slots[p] >= 0) p = (p + 1) & (size_t)(ns - 1);
            slots[p] = (int32_t)q;
        }
        if (w->slots != w->slots0) PyMem_Free(w->slots);
        w->slots = slots;
        w->nslots = ns;
    } else {
        w->slots[j] = (int32_t)k;
    }
    return -1;
}

static int w_str(W *w, PyObject *v) {
    Py_ssize_t i = str_index(w, v);
    if (i == -2) return -1;
    if (i >= 0) {
        if (i < 64) return put(w, (unsigned char)(0xC0 | i));
        TRY(put(w, TG_SREF));
        return uvar(w, (uint64_t)i);
    }
    if (PyUnicode_READY(v)) return -1;
    if (PyUnicode_IS_ASCII(v)) {
        const unsigned char *s = PyUnicode_1BYTE_DATA(v);
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        if (n >= 8 && !(n & 1)) {
            Py_ssize_t q = 0;
            while (q < n && hexval(s[q]) >= 0) q++;
            if (q == n) {
                TRY(put(w, TG_HEX));
                TRY(uvar(w, (uint64_t)(n >> 1)));
                if (grow(w, n >> 1)) return -1;
                for (q = 0; q < n; q += 2)
                    w->buf[w->len++] = (unsigned char)(hexval(s[q]) << 4 | hexval(s[q + 1]));
                return 0;
            }
        }
        if (n < 32) {
            TRY(put(w, (unsigned char)(0x40 | n)));
        } else {
            TRY(put(w, TG_STR));
            TRY(uvar(w, (uint64_t)n));
        }
        return put_bytes(w, s, n);
    }
    PyObject *b = PyUnicode_AsEncodedString(v, "utf-8", "surrogatepass");
    if (!b) return -1;
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    int rc;
    if (n < 32) {
        rc = put(w, (unsigned char)(0x40 | n));
    } else {
        rc = put(w, TG_STR);
        if (!rc) rc = uvar(w, (uint64_t)n);
    }
    if (!rc) rc = put_bytes(w, PyBytes_AS_STRING(b), n);
    Py_DECREF(b);
    return rc;
}

static int w_items(W *w, PyObject *const *items, Py_ssize_t n, int is_list) {
    if (n < 16) {
        TRY(put(w, (unsigned char)((is_list ? 0x60 : 0x70) | n)));
    } else {
        TRY(put(w, is_list ? TG_LIST : TG_TUPLE));
        TRY(uvar(w, (uint64_t)n));
    }
    for (Py_ssize_t i = 0; i < n; i++) TRY(w_val(w, items[i]));
    return 0;
}

static int w_dict(W *w, PyObject *v) {
    Py_ssize_t n = PyDict_GET_SIZE(v);
    if (n < 16) {
        TRY(put(w, (unsigned char)(0x90 | n)));
    } else {
        TRY(put(w, TG_DICT));
        TRY(uvar(w, (uint64_t)n));
    }
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    while (PyDict_Next(v, &pos, &k, &x)) {
        TRY(w_val(w, k));
        TRY(w_val(w, x));
    }
    return 0;
}

static int w_tuple(W *w, PyObject *v) {
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    PyObject *const *items = &PyTuple_GET_ITEM(v, 0);
    int ints = 1;
    for (Py_ssize_t i = 0; i < n && ints; i++) ints = PyLong_CheckExact(items[i]);
    if (ints) {
        Py_hash_t h = PyObject_Hash(v);
        if (h == -1) return -1;
        for (int i = 0; i < w->tn; i++) {
            if (w->th[i] != h) continue;
            int eq = w->tv[i] == v ? 1 : PyObject_RichCompareBool(w->tv[i], v, Py_EQ);
            if (eq < 0) return -1;
            if (eq) return put(w, (unsigned char)(0xA0 | i));
        }
        if (w->tn < TUPS) { /* borrowed: the state holds it while the writer lives */
            w->tv[w->tn] = v;
            w->th[w->tn++] = h;
        }
    }
    return w_items(w, items, n, 0);
}

static int w_val(W *w, PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) return w_str(w, v);
    if (t == &PyLong_Type) return w_int(w, v);
    if (t == &PyFloat_Type) return w_flt(w, PyFloat_AS_DOUBLE(v));
    if (v == Py_None) return put(w, TG_NONE);
    if (t == &PyBool_Type) return put(w, v == Py_True ? TG_TRUE : TG_FALSE);
    if (t == &PyTuple_Type) return w_tuple(w, v);
    if (t == &PyList_Type) return w_items(w, &PyList_GET_ITEM(v, 0), PyList_GET_SIZE(v), 1);
    if (t == &PyDict_Type) return w_dict(w, v);
    return FALLBACK; /* a subclass or a type the codec rejects: codec.py decides */
}

/* a sequence number or watermark: the delta from the previous one */
static int w_seq(W *w, PyObject *s) {
    if (!PyLong_CheckExact(s)) {
        TRY(put(w, TG_NONE));
        return w_val(w, s);
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(s, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow) return FALLBACK;
    __int128 d = (__int128)x - (__int128)w->reg;
    if (d > INT64_MAX || d < INT64_MIN) return FALLBACK;
    w->reg = x;
    return w_int64(w, (int64_t)d);
}

/* attributes of the object being written, released together */
typedef struct {
    PyObject *o[16]; /* a Cls has at most 16 fields */
    int n;
} Attrs;

static void attrs_clear(Attrs *a) {
    for (int i = 0; i < a->n; i++) Py_CLEAR(a->o[i]);
    a->n = 0;
}

/* A class's fields: their names and, for a slotted class, their slots' offsets (read
 * directly: a GetAttr through the type's descriptors costs ~20x more). */
typedef struct {
    int n;
    const char *names[16];
    PyObject *interned[16];
    Py_ssize_t offs[16]; /* -1: read by name */
    int direct;          /* every field a slot and no __post_init__: built by the reader */
    int members;         /* the slots are an extension type's members (built by tp_new) */
} Cls;

static Cls C_ST = {8, {"workspace", "entity", "facts", "unready", "ds", "census_base", "alerted",
                       "last_lsn"}};
static Cls C_FACT = {11, {"seq", "coll", "key", "tomb", "active", "digest", "ready", "arrived",
                          "created", "drive", "cond"}};
static Cls C_DS = {11, {"w", "last_success", "handled", "last_run", "total", "queued", "running",
                        "dead", "jobs_made", "cron_last", "waiting_on"}};
static Cls C_JOB = {6, {"id", "reasons", "created", "settle", "dedupe", "dispatched"}};

/* Where an extension type compiled by Cython keeps the object field `name` (its
 * `cdef public object` member, exposed as a getset property): an instance made by
 * tp_new (every object field None) gets a fresh object through the property, and the
 * one pointer-sized word of the instance that holds it is the field.  -1 if there is
 * not exactly one. */
static PyObject *no_args(void) {
    static PyObject *empty;
    return empty ? empty : (empty = PyTuple_New(0));
}

static Py_ssize_t member_offset(PyTypeObject *t, PyObject *name) {
    PyObject *args = no_args(), *o = NULL, *mark = NULL;
    Py_ssize_t found = -1;
    int hits = 0;
    if (!args || !t->tp_new || !(o = t->tp_new(t, args, NULL)) || !(mark = PyList_New(0)) ||
        PyObject_SetAttr(o, name, mark) < 0) {
        PyErr_Clear();
    } else {
        for (Py_ssize_t off = sizeof(PyObject); off + (Py_ssize_t)sizeof(PyObject *) <=
                 t->tp_basicsize; off += sizeof(PyObject *))
            if (*(PyObject **)((char *)o + off) == mark) {
                found = off;
                hits++;
            }
    }
    Py_XDECREF(o);
    Py_XDECREF(mark);
    return hits == 1 ? found : -1;
}

static int cls_setup(Cls *c, PyTypeObject *t) {
    c->direct = !PyObject_HasAttrString((PyObject *)t, "__post_init__");
    c->members = 0;
    for (int i = 0; i < c->n; i++) {
        if (!c->interned[i] && !(c->interned[i] = PyUnicode_InternFromString(c->names[i])))
            return -1;
        c->offs[i] = -1;
        PyObject *d = _PyType_Lookup(t, c->interned[i]); /* along the MRO: inherited slots */
        if (d && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX) c->offs[i] = m->offset;
        } else if (d && Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
            c->offs[i] = member_offset(t, c->interned[i]);
            c->members = 1;
        }
        if (c->offs[i] < 0) c->direct = 0;
    }
    return 0;
}

/* out[i] = obj's field i, owned by a (released together) */
static int fields(Attrs *a, PyObject *obj, const Cls *c, PyObject **out) {
    for (int i = 0; i < c->n; i++) {
        PyObject *v;
        if (c->offs[i] >= 0 && (v = *(PyObject **)((char *)obj + c->offs[i])) != NULL) {
            Py_INCREF(v);
        } else if (!(v = PyObject_GetAttr(obj, c->interned[i]))) {
            return -1;
        }
        a->o[a->n++] = v;
        out[i] = v;
    }
    return 0;
}

static int same_value(PyObject *a, PyObject *b) {
    /* codec._same for a != b by identity and not both floats: 1 same, 0 not, -1 error,
     * 2 for a type this writer does not compare */
    PyTypeObject *t = Py_TYPE(a);
    if (t != Py_TYPE(b)) return 0;
    if (t == &PyLong_Type || t == &PyUnicode_Type || t == &PyBool_Type)
        return PyObject_RichCompareBool(a, b, Py_EQ);
    return 2;
}

static int w_fact_body(W *w, PyObject *k, PyObject *f, Attrs *a) {
    PyObject *v[11];
    if (fields(a, f, &C_FACT, v)) return -1;
    PyObject *seq = v[0], *coll = v[1], *key = v[2], *tomb = v[3], *active = v[4],
             *digest = v[5], *ready = v[6], *arrived = v[7], *created = v[8], *drive = v[9],
             *cond = v[10];
    int eq = 0;
    if (PyBool_Check(tomb) && PyBool_Check(active) && PyBool_Check(ready) &&
        PyLong_CheckExact(seq) && PyLong_CheckExact(k)) {
        eq = PyObject_RichCompareBool(k, seq, Py_EQ);
        if (eq < 0) return -1;
    }
    if (!eq) {
        TRY(put(w, F_RAW));
        PyObject *all[12] = {k, seq, coll, key, tomb, active, digest, ready, arrived, created,
                             drive, cond};
        for (int i = 0; i < 12; i++) TRY(w_val(w, all[i]));
        return 0;
    }
    int flags = (tomb == Py_True ? F_TOMB : 0) | (active == Py_True ? F_ACTIVE : 0) |
                (ready == Py_True ? F_READY : 0);
    if (key != Py_None) flags |= F_KEY;
    if (!(PyUnicode_CheckExact(digest) && PyUnicode_GET_LENGTH(digest) == 0)) flags |= F_DIGEST;
    if (arrived == Py_None) {
        flags |= F_ARR_NONE;
    } else if (arrived != created) {
        if (PyFloat_CheckExact(arrived) && PyFloat_CheckExact(created)) {
            double x = PyFloat_AS_DOUBLE(arrived), y = PyFloat_AS_DOUBLE(created);
            if (memcmp(&x, &y, 8) != 0) flags |= F_ARR_OWN;
        } else {
            int s = same_value(arrived, created);
            if (s < 0) return -1;
            if (s == 2) return FALLBACK;
            if (!s) flags |= F_ARR_OWN;
        }
    }
    TRY(put(w, (unsigned char)flags));
    TRY(w_seq(w, k));
    TRY(w_val(w, coll));
    if (flags & F_KEY) TRY(w_val(w, key));
    if (flags & F_DIGEST) TRY(w_val(w, digest));
    TRY(w_val(w, created));
    if (flags & F_ARR_OWN) TRY(w_val(w, arrived));
    TRY(w_val(w, drive));
    return w_val(w, cond);
}

static int w_fact(W *w, PyObject *k, PyObject *f) {
    if (Py_TYPE(f) != FactType) return FALLBACK;
    Attrs a = {.n = 0};
    int rc = w_fact_body(w, k, f, &a);
    attrs_clear(&a);
    return rc;
}

static int is_empty_list(PyObject *v) { return PyList_CheckExact(v) && PyList_GET_SIZE(v) == 0; }

static int w_job_body(W *w, PyObject *j, PyObject *name, Attrs *a) {
    PyObject *v[6];
    if (fields(a, j, &C_JOB, v)) return -1;
    PyObject *id = v[0], *reasons = v[1], *created = v[2], *settle = v[3], *dedupe = v[4],
             *dispatched = v[5];
    int mask = 0;
    if (!is_empty_list(settle)) mask |= J_SETTLE;
    if (!is_empty_list(dedupe)) mask |= J_DEDUPE;
    if (dispatched != Py_None) mask |= J_DISPATCHED;
    PyObject *n = NULL;
    if (PyUnicode_CheckExact(id)) {
        PyObject *prefix = PyUnicode_FromFormat("%U/%U/%U/", w->ws, name, w->ent);
        if (!prefix) return -1;
        Py_ssize_t plen = PyUnicode_GET_LENGTH(prefix), ilen = PyUnicode_GET_LENGTH(id);
        int starts = ilen > plen ? (int)PyUnicode_Tailmatch(id, prefix, 0, plen, -1) : 0;
        Py_DECREF(prefix);
        if (starts < 0) return -1;
        if (starts) {
            PyObject *tail = PyUnicode_Substring(id, plen, ilen);
            if (!tail) return -1;
            int digits = PyUnicode_IS_ASCII(tail);
            const unsigned char *s = digits ? PyUnicode_1BYTE_DATA(tail) : NULL;
            Py_ssize_t tn = ilen - plen;
            for (Py_ssize_t i = 0; digits && i < tn; i++) digits = s[i] >= '0' && s[i] <= '9';
            /* str(int(tail)) == tail: no leading zero but in "0" itself */
            if (digits && (tn == 1 || s[0] != '0')) n = PyLong_FromUnicodeObject(tail, 10);
            Py_DECREF(tail);
            if (!n && PyErr_Occurred()) return -1;
            if (n) {
                a->o[a->n++] = n;
                mask |= J_ID_N;
            }
        }
    }
    TRY(put(w, (unsigned char)mask));
    TRY(w_val(w, n ? n : id));
    TRY(w_val(w, reasons));
    TRY(w_val(w, created));
    if (mask & J_SETTLE) TRY(w_val(w, settle));
    if (mask & J_DEDUPE) TRY(w_val(w, dedupe));
    if (mask & J_DISPATCHED) TRY(w_val(w, dispatched));
    return 0;
}

static int w_job(W *w, PyObject *j, PyObject *name) {
    if (Py_TYPE(j) != JobType) return FALLBACK;
    Attrs a = {.n = 0};
    int rc = w_job_body(w, j, name, &a);
    attrs_clear(&a);
    return rc;
}

/* type(x) is int and x == 0 */
static int is_int_zero(PyObject *x) { return PyLong_CheckExact(x) && PyObject_Not(x) == 1; }

static int w_dstate_body(W *w, PyObject *name, PyObject *d, Attrs *a) {
    PyObject *v[11];
    if (fields(a, d, &C_DS, v)) return -1;
    PyObject *dw = v[0], *ls = v[1], *handled = v[2], *lr = v[3], *total = v[4], *queued = v[5],
             *running = v[6], *dead = v[7], *jm = v[8], *cron = v[9], *wo = v[10];
    unsigned mask = 0;
    if (!is_int_zero(dw)) mask |= 1;
    if (ls != Py_None) mask |= 2;
    if (handled != Py_None) mask |= 4;
    if (lr != Py_None) mask |= 8;
    if (!is_int_zero(total)) mask |= 16;
    if (queued != Py_None) mask |= 32;
    if (running != Py_None) mask |= 64;
    if (dead != Py_False) mask |= 128;
    if (!is_int_zero(jm)) mask |= 256;
    if (!(PyDict_CheckExact(cron) && PyDict_GET_SIZE(cron) == 0)) mask |= 512;
    if (wo != Py_None) mask |= 1024;
    TRY(uvar(w, mask));
    if (mask & 1) TRY(w_seq(w, dw));
    if (mask & 2) TRY(w_val(w, ls));
    if (mask & 4) TRY(w_val(w, handled));
    if (mask & 8) TRY(w_val(w, lr));
    if (mask & 16) TRY(w_val(w, total));
    if (mask & 32) TRY(w_job(w, queued, name));
    if (mask & 64) TRY(w_job(w, running, name));
    if (mask & 128) TRY(w_val(w, dead));
    if (mask & 256) TRY(w_val(w, jm));
    if (mask & 512) TRY(w_val(w, cron));
    if (mask & 1024) TRY(w_val(w, wo));
    return 0;
}

static int w_dstate(W *w, PyObject *name, PyObject *d) {
    if (Py_TYPE(d) != DStateType || !PyUnicode_CheckExact(name)) return FALLBACK;
    TRY(w_val(w, name));
    Attrs a = {.n = 0};
    int rc = w_dstate_body(w, name, d, &a);
    attrs_clear(&a);
    return rc;
}

static int truthy_dict(PyObject *v) { return PyDict_GET_SIZE(v) > 0; }

static int w_state(W *w, PyObject *st, int identity, Attrs *a) {
    PyObject *fv[8];
    if (fields(a, st, &C_ST, fv)) return -1;
    PyObject *facts = fv[2], *unready = fv[3], *ds = fv[4], *census = fv[5], *alerted = fv[6],
             *lsn = fv[7];
    w->ws = fv[0];
    w->ent = fv[1];
    if (!PyUnicode_CheckExact(w->ws) || !PyUnicode_CheckExact(w->ent) ||
        !PyDict_CheckExact(facts) || !PyDict_CheckExact(unready) || !PyDict_CheckExact(ds) ||
        !PyDict_CheckExact(census))
        return FALLBACK;
    int mask = identity ? S_IDENT : 0;
    if (truthy_dict(facts)) mask |= S_FACTS;
    if (truthy_dict(unready)) mask |= S_UNREADY;
    if (truthy_dict(ds)) mask |= S_DS;
    if (truthy_dict(census)) mask |= S_CENSUS;
    if (!is_empty_list(alerted)) mask |= S_ALERTED;
    int lsn_zero = 0;
    if (PyLong_CheckExact(lsn)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(lsn, &overflow);
        if (x == -1 && PyErr_Occurred()) return -1;
        lsn_zero = !overflow && x == 0;
    }
    if (!lsn_zero) mask |= S_LSN;
    TRY(put(w, V1));
    TRY(put(w, (unsigned char)mask));
    if (identity) {
        TRY(w_val(w, w->ws));
        TRY(w_val(w, w->ent));
    }
    Py_ssize_t pos;
    PyObject *k, *v;
    if (mask & S_FACTS) {
        TRY(uvar(w, (uint64_t)PyDict_GET_SIZE(facts)));
        pos = 0;
        while (PyDict_Next(facts, &pos, &k, &v)) TRY(w_fact(w, k, v));
    }
    if (mask & S_UNREADY) {
        TRY(uvar(w, (uint64_t)PyDict_GET_SIZE(unready)));
        pos = 0;
        while (PyDict_Next(unready, &pos, &k, &v)) {
            TRY(w_seq(w, k));
            TRY(w_val(w, v));
        }
    }
    if (mask & S_DS) {
        TRY(uvar(w, (uint64_t)PyDict_GET_SIZE(ds)));
        pos = 0;
        while (PyDict_Next(ds, &pos, &k, &v)) TRY(w_dstate(w, k, v));
    }
    if (mask & S_CENSUS) TRY(w_val(w, census));
    if (mask & S_ALERTED) TRY(w_val(w, alerted));
    if (mask & S_LSN) TRY(w_val(w, lsn));
    return 0;
}

PyDoc_STRVAR(encode_body_doc,
             "encode_body(st, identity) -> bytes | None\n\n"
             "The version-1 body of an EntityState, undeflated, as codec.py writes it; None "
             "when st holds something only codec.py handles.");

static PyObject *encode_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_body(st, identity)");
        return NULL;
    }
    if (!FactType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup() was not called");
        return NULL;
    }
    PyObject *st = args[0];
    if (Py_TYPE(st) != EntityStateType) Py_RETURN_NONE;
    int identity = PyObject_IsTrue(args[1]);
    if (identity < 0) return NULL;
    W w = {0};
    w.cap = 256;
    w.buf = PyMem_Malloc(w.cap);
    w.sv = w.sv0;
    w.sh = w.sh0;
    w.scap = 16;
    w.slots = w.slots0;
    w.nslots = 32;
    memset(w.slots0, 0xff, sizeof w.slots0);
    PyObject *out = NULL;
    Attrs a = {.n = 0};
    if (w.buf) {
        int rc = w_state(&w, st, identity, &a);
        if (rc == 0) {
            out = PyBytes_FromStringAndSize((const char *)w.buf, w.len);
        } else if (rc == FALLBACK) {
            out = Py_NewRef(Py_None);
        }
    } else {
        PyErr_NoMemory();
    }
    attrs_clear(&a);
    PyMem_Free(w.buf);
    if (w.sv != w.sv0) {
        PyMem_Free(w.sv);
        PyMem_Free(w.sh);
    }
    if (w.slots != w.slots0) PyMem_Free(w.slots);
    return out;
}

/* -- the reader ----------------------------------------------------------------------------
 * r_* return 0 with *out set (a new reference), -1 on an error, FALLBACK when the bytes are
 * not a state this reader vouches for (corrupt, or values only codec.py builds): the caller
 * then decodes with codec.py, which raises the precise error. */

typedef struct {
    const unsigned char *d;
    Py_ssize_t pos, len;
    PyObject **sv; /* strings read, owned */
    Py_ssize_t sn, scap;
    PyObject *tv[TUPS]; /* tuples of ints read, owned */
    int tn;
    int has_fbits;
    int64_t fbits;
    int64_t reg;
    PyObject *sv0[16];
} R;

#define NEED(r, n)                                          \
    do {                                                    \
        if ((r)->len - (r)->pos < (Py_ssize_t)(n)) return FALLBACK; \
    } while (0)

static int r_byte(R *r, unsigned *b) {
    NEED(r, 1);
    *b = r->d[r->pos++];
    return 0;
}

/* a varint of at most 64 bits (FALLBACK for longer ones) */
static int r_uvar(R *r, uint64_t *out) {
    uint64_t n = 0;
    for (int shift = 0;; shift += 7) {
        NEED(r, 1);
        unsigned b = r->d[r->pos++];
        if (shift == 63 && (b & 0x7E)) return FALLBACK;
        if (shift > 63) return FALLBACK;
        n |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
    }
    *out = n;
    return 0;
}

/* a varint of any size, as an int */
static int r_uvar_obj(R *r, PyObject **out) {
    Py_ssize_t start = r->pos, end = start;
    while (1) {
        if (end >= r->len) return FALLBACK;
        if (!(r->d[end++] & 0x80)) break;
    }
    Py_ssize_t groups = end - start;
    if (groups <= 9) { /* 63 bits */
        uint64_t n;
        TRY(r_uvar(r, &n));
        *out = PyLong_FromUnsignedLongLong(n);
        return *out ? 0 : -1;
    }
    Py_ssize_t nbytes = (groups * 7 + 7) / 8;
    unsigned char *buf = PyMem_Calloc(nbytes, 1);
    if (!buf) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t bit = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        unsigned v = r->d[start + g] & 0x7F;
        for (int i = 0; i < 7; i++, bit++)
            if (v >> i & 1) buf[bit >> 3] |= (unsigned char)(1u << (bit & 7));
    }
    r->pos = end;
    *out = _PyLong_FromByteArray(buf, nbytes, 1, 0);
    PyMem_Free(buf);
    return *out ? 0 : -1;
}

static int r_val(R *r, PyObject **out);

static int r_keep_str(R *r, PyObject *s) {
    if (r->sn == r->scap) {
        Py_ssize_t cap = r->scap * 2;
        PyObject **sv = PyMem_Malloc(cap * sizeof(PyObject *));
        if (!sv) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(sv, r->sv, r->sn * sizeof(PyObject *));
        if (r->sv != r->sv0) PyMem_Free(r->sv);
        r->sv = sv;
        r->scap = cap;
    }
    r->sv[r->sn++] = Py_NewRef(s);
    return 0;
}

static int r_str(R *r, Py_ssize_t n, PyObject **out) {
    NEED(r, n);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->d + r->pos, n, "surrogatepass");
    if (!s) return -1; /* a UnicodeDecodeError: the caller falls back */
    r->pos += n;
    if (r_keep_str(r, s)) {
        Py_DECREF(s);
        return -1;
    }
    *out = s;
    return 0;
}

static int r_hex(R *r, PyObject **out) {
    uint64_t n;
    TRY(r_uvar(r, &n));
    if (n > (uint64_t)(r->len - r->pos)) return FALLBACK;
    static const char digits[] = "0123456789abcdef";
    PyObject *s = PyUnicode_New((Py_ssize_t)n * 2, 127);
    if (!s) return -1;
    Py_UCS1 *p = PyUnicode_1BYTE_DATA(s);
    for (uint64_t i = 0; i < n; i++) {
        unsigned b = r->d[r->pos + i];
        p[2 * i] = digits[b >> 4];
        p[2 * i + 1] = digits[b & 15];
    }
    r->pos += (Py_ssize_t)n;
    if (r_keep_str(r, s)) {
        Py_DECREF(s);
        return -1;
    }
    *out = s;
    return 0;
}

static int r_list(R *r, Py_ssize_t n, PyObject **out) {
    if (n > r->len - r->pos) return FALLBACK; /* every item takes a byte at least */
    PyObject *l = PyList_New(n);
    if (!l) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x;
        int rc = r_val(r, &x);
        if (rc) {
            Py_DECREF(l);
            return rc;
        }
        PyList_SET_ITEM(l, i, x);
    }
    *out = l;
    return 0;
}

static int r_tuple(R *r, Py_ssize_t n, PyObject **out) {
    if (n > r->len - r->pos) return FALLBACK;
    PyObject *t = PyTuple_New(n);
    if (!t) return -1;
    int ints = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x;
        int rc = r_val(r, &x);
        if (rc) {
            Py_DECREF(t);
            return rc;
        }
        ints = ints && PyLong_CheckExact(x);
        PyTuple_SET_ITEM(t, i, x);
    }
    if (ints && r->tn < TUPS) r->tv[r->tn++] = Py_NewRef(t);
    *out = t;
    return 0;
}

static int r_dict(R *r, Py_ssize_t n, PyObject **out) {
    if (n > r->len - r->pos) return FALLBACK;
    PyObject *d = PyDict_New();
    if (!d) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k, *v;
        int rc = r_val(r, &k);
        if (!rc) {
            rc = r_val(r, &v);
            if (!rc) {
                rc = PyDict_SetItem(d, k, v) ? -1 : 0;
                Py_DECREF(v);
            }
            Py_DECREF(k);
        }
        if (rc) {
            Py_DECREF(d);
            return rc;
        }
    }
    *out = d;
    return 0;
}

static PyObject *float_of_bits(int64_t bits) {
    double x;
    memcpy(&x, &bits, 8);
    return PyFloat_FromDouble(x);
}

static int r_op(R *r, unsigned t, PyObject **out) {
    uint64_t n;
    switch (t) {
    case TG_NONE:
        *out = Py_NewRef(Py_None);
        return 0;
    case TG_FALSE:
        *out = Py_NewRef(Py_False);
        return 0;
    case TG_TRUE:
        *out = Py_NewRef(Py_True);
        return 0;
    case TG_UINT:
    case TG_NINT: {
        PyObject *u;
        TRY(r_uvar_obj(r, &u));
        PyObject *k = PyLong_FromLong(t == TG_UINT ? 64 : -1);
        *out = k ? (t == TG_UINT ? PyNumber_Add(u, k) : PyNumber_Subtract(k, u)) : NULL;
        Py_XDECREF(k);
        Py_DECREF(u);
        return *out ? 0 : -1;
    }
    case TG_FINT:
        TRY(r_uvar(r, &n));
        if (n >> 62) return FALLBACK;
        *out = PyFloat_FromDouble(
            (double)(!(n & 1) ? (int64_t)(n >> 1) : -(int64_t)((n + 1) >> 1)));
        return *out ? 0 : -1;
    case TG_FDELTA: {
        if (!r->has_fbits) return FALLBACK;
        TRY(r_uvar(r, &n));
        __int128 d = !(n & 1) ? (__int128)(n >> 1) : -(__int128)((n >> 1) + 1);
        __int128 bits = (__int128)r->fbits + d;
        if (bits > INT64_MAX || bits < INT64_MIN) return FALLBACK;
        r->fbits = (int64_t)bits;
        *out = float_of_bits(r->fbits);
        return *out ? 0 : -1;
    }
    case TG_F64: {
        NEED(r, 8);
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u |= (uint64_t)r->d[r->pos + i] << (8 * i);
        r->pos += 8;
        r->fbits = (int64_t)u;
        r->has_fbits = 1;
        *out = float_of_bits(r->fbits);
        return *out ? 0 : -1;
    }
    case TG_FSAME:
        if (!r->has_fbits) return FALLBACK;
        *out = float_of_bits(r->fbits);
        return *out ? 0 : -1;
    case TG_STR:
        TRY(r_uvar(r, &n));
        if (n > (uint64_t)(r->len - r->pos)) return FALLBACK;
        return r_str(r, (Py_ssize_t)n, out);
    case TG_SREF:
        TRY(r_uvar(r, &n));
        if (n >= (uint64_t)r->sn) return FALLBACK;
        *out = Py_NewRef(r->sv[n]);
        return 0;
    case TG_LIST:
        TRY(r_uvar(r, &n));
        if (n > (uint64_t)r->len) return FALLBACK;
        return r_list(r, (Py_ssize_t)n, out);
    case TG_TUPLE:
        TRY(r_uvar(r, &n));
        if (n > (uint64_t)r->len) return FALLBACK;
        return r_tuple(r, (Py_ssize_t)n, out);
    case TG_DICT:
        TRY(r_uvar(r, &n));
        if (n > (uint64_t)r->len) return FALLBACK;
        return r_dict(r, (Py_ssize_t)n, out);
    case TG_HEX:
        return r_hex(r, out);
    default:
        return FALLBACK;
    }
}

static int r_val(R *r, PyObject **out) {
    unsigned t;
    TRY(r_byte(r, &t));
    if (t < 0x40) {
        *out = PyLong_FromLong((long)t);
        return *out ? 0 : -1;
    }
    if (t >= 0xC0) {
        if (t - 0xC0 >= (unsigned)r->sn) return FALLBACK;
        *out = Py_NewRef(r->sv[t - 0xC0]);
        return 0;
    }
    if (t >= 0x80) {
        if (t < 0x90) return r_op(r, t, out);
        if (t < 0xA0) return r_dict(r, t - 0x90, out);
        if (t < 0xA0 + TUPS) {
            if (t - 0xA0 >= (unsigned)r->tn) return FALLBACK;
            *out = Py_NewRef(r->tv[t - 0xA0]);
            return 0;
        }
        return FALLBACK;
    }
    if (t < 0x60) return r_str(r, t - 0x40, out);
    if (t < 0x70) return r_list(r, t - 0x60, out);
    return r_tuple(r, t - 0x70, out);
}

/* a sequence number or watermark (the delta from the previous one) */
static int r_seq(R *r, PyObject **out) {
    NEED(r, 1);
    if (r->d[r->pos] == TG_NONE) {
        r->pos++;
        return r_val(r, out);
    }
    PyObject *v;
    TRY(r_val(r, &v));
    int overflow = 0;
    long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
    int ok = PyLong_CheckExact(v) && !overflow && !(x == -1 && PyErr_Occurred());
    Py_DECREF(v);
    if (!ok) return PyErr_Occurred() ? -1 : FALLBACK;
    __int128 s = (__int128)r->reg + x;
    if (s > INT64_MAX || s < INT64_MIN) return FALLBACK;
    r->reg = (int64_t)s;
    *out = PyLong_FromLongLong(r->reg);
    return *out ? 0 : -1;
}

/* An instance of a slotted class of the core, its fields set from vals (stolen). The
 * classes' __init__ only assigns (setup() checks there is no __post_init__). */
static PyObject *make(PyTypeObject *t, const Cls *c, PyObject **vals) {
    PyObject *o = NULL;
    if (c->direct && c->members) {
        /* an extension type's tp_new sets up what else it holds (its methods' table)
         * and every field to None */
        PyObject *args = no_args();
        if (args && (o = t->tp_new(t, args, NULL)))
            for (int i = 0; i < c->n; i++)
                Py_XSETREF(*(PyObject **)((char *)o + c->offs[i]), vals[i]);
    } else if (c->direct) {
        o = t->tp_alloc(t, 0);
        if (o)
            for (int i = 0; i < c->n; i++) *(PyObject **)((char *)o + c->offs[i]) = vals[i];
    } else {
        o = PyObject_Vectorcall((PyObject *)t, vals, c->n, NULL);
        for (int i = 0; i < c->n; i++) Py_DECREF(vals[i]);
        return o;
    }
    if (!o)
        for (int i = 0; i < c->n; i++) Py_DECREF(vals[i]);
    return o;
}

static void clear_vals(PyObject **v, int n) {
    for (int i = 0; i < n; i++) Py_CLEAR(v[i]);
}

static int r_fact(R *r, PyObject **k, PyObject **out) {
    unsigned flags;
    TRY(r_byte(r, &flags));
    PyObject *v[11] = {NULL};
    int rc;
    if (flags == F_RAW) {
        TRY(r_val(r, k));
        for (int i = 0; i < 11; i++) {
            if ((rc = r_val(r, &v[i]))) {
                clear_vals(v, 11);
                Py_CLEAR(*k);
                return rc;
            }
        }
    } else {
        /* seq coll key tomb active digest ready arrived created drive cond */
        if ((rc = r_seq(r, &v[0])) || (rc = r_val(r, &v[1]))) goto fail;
        if (flags & F_KEY) {
            if ((rc = r_val(r, &v[2]))) goto fail;
        } else {
            v[2] = Py_NewRef(Py_None);
        }
        v[3] = Py_NewRef(flags & F_TOMB ? Py_True : Py_False);
        v[4] = Py_NewRef(flags & F_ACTIVE ? Py_True : Py_False);
        if (flags & F_DIGEST) {
            if ((rc = r_val(r, &v[5]))) goto fail;
        } else if (!(v[5] = PyUnicode_New(0, 0))) {
            rc = -1;
            goto fail;
        }
        v[6] = Py_NewRef(flags & F_READY ? Py_True : Py_False);
        if ((rc = r_val(r, &v[8]))) goto fail;
        if (flags & F_ARR_NONE) {
            v[7] = Py_NewRef(Py_None);
        } else if (flags & F_ARR_OWN) {
            if ((rc = r_val(r, &v[7]))) goto fail;
        } else {
            v[7] = Py_NewRef(v[8]);
        }
        if ((rc = r_val(r, &v[9])) || (rc = r_val(r, &v[10]))) goto fail;
        *k = Py_NewRef(v[0]);
    }
    *out = make(FactType, &C_FACT, v);
    if (!*out) {
        Py_CLEAR(*k);
        return -1;
    }
    return 0;
fail:
    clear_vals(v, 11);
    return rc;
}

static int r_job(R *r, PyObject *ws, PyObject *ent, PyObject *name, PyObject **out) {
    unsigned mask;
    TRY(r_byte(r, &mask));
    PyObject *v[6] = {NULL}; /* id reasons created settle dedupe dispatched */
    int rc;
    if ((rc = r_val(r, &v[0]))) return rc;
    if (mask & J_ID_N) {
        if (!PyUnicode_CheckExact(name) || !PyLong_CheckExact(v[0])) {
            rc = FALLBACK;
            goto fail;
        }
        PyObject *id = PyUnicode_FromFormat("%U/%U/%U/%S", ws, name, ent, v[0]);
        if (!id) {
            rc = -1;
            goto fail;
        }
        Py_SETREF(v[0], id);
    }
    if ((rc = r_val(r, &v[1])) || (rc = r_val(r, &v[2]))) goto fail;
    if (mask & J_SETTLE) {
        if ((rc = r_val(r, &v[3]))) goto fail;
    } else if (!(v[3] = PyList_New(0))) {
        rc = -1;
        goto fail;
    }
    if (mask & J_DEDUPE) {
        if ((rc = r_val(r, &v[4]))) goto fail;
    } else if (!(v[4] = PyList_New(0))) {
        rc = -1;
        goto fail;
    }
    if (mask & J_DISPATCHED) {
        if ((rc = r_val(r, &v[5]))) goto fail;
    } else {
        v[5] = Py_NewRef(Py_None);
    }
    *out = make(JobType, &C_JOB, v);
    return *out ? 0 : -1;
fail:
    clear_vals(v, 6);
    return rc;
}

static int r_dstate(R *r, PyObject *ws, PyObject *ent, PyObject **name, PyObject **out) {
    TRY(r_val(r, name));
    uint64_t mask;
    PyObject *v[11] = {NULL};
    int rc;
    if ((rc = r_uvar(r, &mask))) goto fail;
    /* w last_success handled last_run total queued running dead jobs_made cron_last
     * waiting_on */
    if (mask & 1) {
        if ((rc = r_seq(r, &v[0]))) goto fail;
    }
    for (int i = 1; i <= 4; i++)
        if ((mask >> i & 1) && (rc = r_val(r, &v[i]))) goto fail;
    if ((mask & 32) && (rc = r_job(r, ws, ent, *name, &v[5]))) goto fail;
    if ((mask & 64) && (rc = r_job(r, ws, ent, *name, &v[6]))) goto fail;
    for (int i = 7; i <= 10; i++)
        if ((mask >> i & 1) && (rc = r_val(r, &v[i]))) goto fail;
    /* the defaults of DState's fields */
    if (!v[0] && !(v[0] = PyLong_FromLong(0))) goto nomem;
    for (int i = 1; i <= 3; i++)
        if (!v[i]) v[i] = Py_NewRef(Py_None);
    if (!v[4] && !(v[4] = PyLong_FromLong(0))) goto nomem;
    if (!v[5]) v[5] = Py_NewRef(Py_None);
    if (!v[6]) v[6] = Py_NewRef(Py_None);
    if (!v[7]) v[7] = Py_NewRef(Py_False);
    if (!v[8] && !(v[8] = PyLong_FromLong(0))) goto nomem;
    if (!v[9] && !(v[9] = PyDict_New())) goto nomem;
    if (!v[10]) v[10] = Py_NewRef(Py_None);
    *out = make(DStateType, &C_DS, v);
    if (*out) return 0;
    Py_CLEAR(*name);
    return -1;
nomem:
    rc = -1;
fail:
    clear_vals(v, 11);
    Py_CLEAR(*name);
    return rc;
}

static int r_state(R *r, PyObject *ws, PyObject *ent, PyObject **out) {
    unsigned mask;
    TRY(r_byte(r, &mask));
    /* workspace entity facts unready ds census_base alerted last_lsn */
    PyObject *v[8] = {NULL};
    int rc = 0;
    if (mask & S_IDENT) {
        if ((rc = r_val(r, &v[0])) || (rc = r_val(r, &v[1]))) goto fail;
    } else {
        v[0] = Py_XNewRef(ws);
        v[1] = Py_XNewRef(ent);
    }
    if (!v[0] || !v[1] || !PyUnicode_CheckExact(v[0]) || !PyUnicode_CheckExact(v[1])) {
        rc = FALLBACK;
        goto fail;
    }
    if (!(v[2] = PyDict_New()) || !(v[3] = PyDict_New()) || !(v[4] = PyDict_New())) goto nomem;
    uint64_t n;
    if (mask & S_FACTS) {
        if ((rc = r_uvar(r, &n))) goto fail;
        for (uint64_t i = 0; i < n; i++) {
            PyObject *k, *f;
            if ((rc = r_fact(r, &k, &f))) goto fail;
            rc = PyDict_SetItem(v[2], k, f) ? -1 : 0;
            Py_DECREF(k);
            Py_DECREF(f);
            if (rc) goto fail;
        }
    }
    if (mask & S_UNREADY) {
        if ((rc = r_uvar(r, &n))) goto fail;
        for (uint64_t i = 0; i < n; i++) {
            PyObject *s, *x;
            if ((rc = r_seq(r, &s))) goto fail;
            if ((rc = r_val(r, &x))) {
                Py_DECREF(s);
                goto fail;
            }
            rc = PyDict_SetItem(v[3], s, x) ? -1 : 0;
            Py_DECREF(s);
            Py_DECREF(x);
            if (rc) goto fail;
        }
    }
    if (mask & S_DS) {
        if ((rc = r_uvar(r, &n))) goto fail;
        for (uint64_t i = 0; i < n; i++) {
            PyObject *name, *d;
            if ((rc = r_dstate(r, v[0], v[1], &name, &d))) goto fail;
            rc = PyDict_SetItem(v[4], name, d) ? -1 : 0;
            Py_DECREF(name);
            Py_DECREF(d);
            if (rc) goto fail;
        }
    }
    if (mask & S_CENSUS) {
        if ((rc = r_val(r, &v[5]))) goto fail;
    } else if (!(v[5] = PyDict_New())) {
        goto nomem;
    }
    if (mask & S_ALERTED) {
        if ((rc = r_val(r, &v[6]))) goto fail;
    } else if (!(v[6] = PyList_New(0))) {
        goto nomem;
    }
    if (mask & S_LSN) {
        if ((rc = r_val(r, &v[7]))) goto fail;
    } else if (!(v[7] = PyLong_FromLong(0))) {
        goto nomem;
    }
    if (r->pos != r->len) {
        rc = FALLBACK;
        goto fail;
    }
    *out = make(EntityStateType, &C_ST, v);
    return *out ? 0 : -1;
nomem:
    rc = -1;
fail:
    clear_vals(v, 8);
    return rc;
}

PyDoc_STRVAR(decode_body_doc,
             "decode_body(data, workspace, entity) -> EntityState | None\n\n"
             "The EntityState of version-1 bytes (data[0] is the version byte), as codec.py "
             "reads it; None when codec.py must (corrupt bytes, values it alone builds).");

static PyObject *decode_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode_body(data, workspace, entity)");
        return NULL;
    }
    if (!FactType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup() was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0])) Py_RETURN_NONE;
    R r = {0};
    r.d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    r.len = PyBytes_GET_SIZE(args[0]);
    r.pos = 1;
    r.sv = r.sv0;
    r.scap = 16;
    PyObject *ws = args[1] == Py_None ? NULL : args[1];
    PyObject *ent = args[2] == Py_None ? NULL : args[2];
    PyObject *out = NULL;
    int rc = r.len >= 1 ? r_state(&r, ws, ent, &out) : FALLBACK;
    for (Py_ssize_t i = 0; i < r.sn; i++) Py_DECREF(r.sv[i]);
    if (r.sv != r.sv0) PyMem_Free(r.sv);
    for (int i = 0; i < r.tn; i++) Py_DECREF(r.tv[i]);
    if (rc == 0) return out;
    if (rc == -1 && PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;
    PyErr_Clear(); /* codec.py decodes it again and says what is wrong */
    Py_RETURN_NONE;
}

/* -- ready batches (wakeline/streams/ready.py) ----------------------------------------------
 * ready_items(items): the Items of a decoded batch's "items" array, as ready.decode builds
 * them, or None when ready.py must (anything but the shapes it writes: it then raises the
 * BadBatch the message deserves). */

static PyTypeObject *ItemType, *RecordChangedType, *RecType, *CursorAdvancedType;
static Cls C_ITEM = {5, {"key", "workspace", "entity", "offset", "events"}};
static Cls C_RC = {4, {"op", "after", "before", "lsn"}};
static Cls C_REC = {14, {"seq", "collection", "version", "type", "status", "key", "content",
                         "text", "tombstone", "annotations", "scores", "enriched_at",
                         "created_at", "parents"}};
static PyObject *s_r, *s_a;

/* (hi << 64) | lo of two ints, NULL with no exception when they are not ints */
static PyObject *lsn_of(PyObject *hi, PyObject *lo) {
    if (!PyLong_CheckExact(hi) || !PyLong_CheckExact(lo)) return NULL;
    int zero = PyObject_Not(hi);
    if (zero < 0) return NULL;
    if (zero) return Py_NewRef(lo);
    PyObject *k = PyLong_FromLong(64);
    PyObject *sh = k ? PyNumber_Lshift(hi, k) : NULL;
    Py_XDECREF(k);
    PyObject *out = sh ? PyNumber_Or(sh, lo) : NULL;
    Py_XDECREF(sh);
    return out;
}

/* ready._unrec: None, or a Rec of a 14-item list whose last item (parents) is a list */
static int rd_rec(PyObject *v, PyObject **out) {
    if (v == Py_None) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != 14 ||
        !PyList_CheckExact(PyList_GET_ITEM(v, 13)))
        return FALLBACK;
    PyObject *vals[14];
    for (int i = 0; i < 13; i++) vals[i] = Py_NewRef(PyList_GET_ITEM(v, i));
    vals[13] = PyList_AsTuple(PyList_GET_ITEM(v, 13));
    if (!vals[13]) {
        clear_vals(vals, 13);
        return -1;
    }
    *out = make(RecType, &C_REC, vals);
    return *out ? 0 : -1;
}

/* ready._unevent */
static int rd_event(PyObject *e, PyObject **out) {
    if (!PyList_CheckExact(e) || PyList_GET_SIZE(e) < 1) return FALLBACK;
    PyObject *tag = PyList_GET_ITEM(e, 0);
    if (!PyUnicode_CheckExact(tag)) return FALLBACK;
    Py_ssize_t n = PyList_GET_SIZE(e);
    PyObject *const *x = &PyList_GET_ITEM(e, 0);
    if (PyUnicode_Compare(tag, s_r) == 0) {
        if (n < 6) return FALLBACK;
        PyObject *vals[4] = {Py_NewRef(x[1]), NULL, NULL, NULL};
        int rc = rd_rec(x[2], &vals[1]);
        if (!rc) rc = rd_rec(x[3], &vals[2]);
        if (!rc && !(vals[3] = lsn_of(x[4], x[5]))) rc = PyErr_Occurred() ? -1 : FALLBACK;
        if (rc) {
            clear_vals(vals, 4);
            return rc;
        }
        *out = make(RecordChangedType, &C_RC, vals);
        return *out ? 0 : -1;
    }
    if (PyUnicode_Compare(tag, s_a) == 0) {
        if (n < 8) return FALLBACK;
        PyObject *lsn = lsn_of(x[6], x[7]);
        if (!lsn) return PyErr_Occurred() ? -1 : FALLBACK;
        PyObject *args[6] = {x[1], x[2], x[3], x[4], x[5], lsn};
        *out = PyObject_Vectorcall((PyObject *)CursorAdvancedType, args, 6, NULL);
        Py_DECREF(lsn);
        return *out ? 0 : -1;
    }
    return FALLBACK;
}

static int rd_item(PyObject *it, PyObject **out) {
    if (!PyList_CheckExact(it) || PyList_GET_SIZE(it) < 4 ||
        !PyUnicode_CheckExact(PyList_GET_ITEM(it, 0)))
        return FALLBACK;
    Py_ssize_t n = PyList_GET_SIZE(it);
    PyObject *vals[5] = {NULL};
    int rc = 0;
    if (!(vals[0] = PyUnicode_AsUTF8String(PyList_GET_ITEM(it, 0)))) return -1;
    for (int i = 1; i < 4; i++) vals[i] = Py_NewRef(PyList_GET_ITEM(it, i));
    if (!(vals[4] = PyList_New(n - 4))) {
        rc = -1;
        goto fail;
    }
    for (Py_ssize_t i = 4; i < n; i++) {
        PyObject *ev;
        if ((rc = rd_event(PyList_GET_ITEM(it, i), &ev))) goto fail;
        PyList_SET_ITEM(vals[4], i - 4, ev);
    }
    *out = make(ItemType, &C_ITEM, vals);
    return *out ? 0 : -1;
fail:
    clear_vals(vals, 5);
    return rc;
}

/* ---- writing: ready.encode's "items" array ---------------------------------------------
 * ready_doc(items): [[key.decode(), workspace, entity, offset, *events], ...] with each event
 * as ready._event writes it, or None when ready.py must (anything but the exact classes, a
 * key that is not UTF-8): the lists orjson then writes. */

static Cls C_CA = {6, {"derivation", "watermark", "finished_at", "outcome", "job_id", "lsn"}};
static PyObject *s_64, *s_mask64;

/* ready._rec: None, or the 14 fields of a Rec as a list */
static int wr_rec(PyObject *r, PyObject **out) {
    if (r == Py_None) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!Py_IS_TYPE(r, RecType)) return FALLBACK;
    Attrs a = {.n = 0};
    PyObject *v[14];
    if (fields(&a, r, &C_REC, v)) {
        attrs_clear(&a);
        return -1;
    }
    PyObject *l = PyList_New(14);
    if (l)
        for (int i = 0; i < 14; i++) PyList_SET_ITEM(l, i, Py_NewRef(v[i]));
    attrs_clear(&a);
    *out = l;
    return l ? 0 : -1;
}

/* l[i], l[i + 1] = lsn >> 64, lsn & (2**64 - 1) */
static int wr_lsn(PyObject *l, Py_ssize_t i, PyObject *lsn) {
    if (!PyLong_CheckExact(lsn)) return FALLBACK;
    PyObject *hi, *lo;
    unsigned long long u = PyLong_AsUnsignedLongLong(lsn);
    if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
        hi = PyLong_FromLong(0);
        lo = PyLong_FromUnsignedLongLong(u);
    } else { /* beyond 64 bits, or negative */
        PyErr_Clear();
        hi = PyNumber_Rshift(lsn, s_64);
        lo = PyNumber_And(lsn, s_mask64);
    }
    if (!hi || !lo) {
        Py_XDECREF(hi);
        Py_XDECREF(lo);
        return -1;
    }
    PyList_SET_ITEM(l, i, hi);
    PyList_SET_ITEM(l, i + 1, lo);
    return 0;
}

/* ready._event */
static int wr_event(PyObject *e, PyObject **out) {
    Attrs a = {.n = 0};
    PyObject *v[6], *l = NULL;
    int rc;
    if (Py_IS_TYPE(e, RecordChangedType)) {
        if (fields(&a, e, &C_RC, v) || !(l = PyList_New(6))) {
            rc = -1;
            goto done;
        }
        PyList_SET_ITEM(l, 0, Py_NewRef(s_r));
        PyList_SET_ITEM(l, 1, Py_NewRef(v[0]));
        PyObject *after, *before;
        if ((rc = wr_rec(v[1], &after))) goto done;
        PyList_SET_ITEM(l, 2, after);
        if ((rc = wr_rec(v[2], &before))) goto done;
        PyList_SET_ITEM(l, 3, before);
        rc = wr_lsn(l, 4, v[3]);
    } else if (Py_IS_TYPE(e, CursorAdvancedType)) {
        if (fields(&a, e, &C_CA, v) || !(l = PyList_New(8))) {
            rc = -1;
            goto done;
        }
        PyList_SET_ITEM(l, 0, Py_NewRef(s_a));
        for (int i = 0; i < 5; i++) PyList_SET_ITEM(l, i + 1, Py_NewRef(v[i]));
        rc = wr_lsn(l, 6, v[5]);
    } else {
        return FALLBACK;
    }
done:
    attrs_clear(&a);
    if (rc) {
        Py_XDECREF(l); /* unset items are NULL: list_dealloc skips them */
        return rc;
    }
    *out = l;
    return 0;
}

static int wr_item(PyObject *it, PyObject **out) {
    if (!Py_IS_TYPE(it, ItemType)) return FALLBACK;
    Attrs a = {.n = 0};
    PyObject *v[5], *l = NULL;
    int rc = 0;
    if (fields(&a, it, &C_ITEM, v)) {
        rc = -1;
        goto done;
    }
    if (!PyBytes_CheckExact(v[0]) || !PyList_CheckExact(v[4])) {
        rc = FALLBACK;
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(v[4]);
    if (!(l = PyList_New(4 + n))) {
        rc = -1;
        goto done;
    }
    PyObject *key = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(v[0]), PyBytes_GET_SIZE(v[0]), NULL);
    if (!key) {
        rc = PyErr_ExceptionMatches(PyExc_UnicodeDecodeError) ? (PyErr_Clear(), FALLBACK) : -1;
        goto done;
    }
    PyList_SET_ITEM(l, 0, key);
    for (int i = 1; i < 4; i++) PyList_SET_ITEM(l, i, Py_NewRef(v[i]));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev;
        if ((rc = wr_event(PyList_GET_ITEM(v[4], i), &ev))) goto done;
        PyList_SET_ITEM(l, 4 + i, ev);
    }
done:
    attrs_clear(&a);
    if (rc) {
        Py_XDECREF(l);
        return rc;
    }
    *out = l;
    return 0;
}

PyDoc_STRVAR(ready_doc_doc,
             "ready_doc(items) -> list | None\n\n"
             "A ready batch's \"items\" array as ready.encode builds it from Items; None when "
             "ready.py must (anything but the exact classes it writes).");

static PyObject *ready_doc(PyObject *self, PyObject *items) {
    if (!ItemType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup_ready() was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(items, "ready_doc() needs a sequence of Items");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (!out) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item;
        int rc = wr_item(PySequence_Fast_GET_ITEM(seq, i), &item);
        if (rc) {
            Py_DECREF(out);
            Py_DECREF(seq);
            if (rc == -1) return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(ready_items_doc,
             "ready_items(items) -> list[Item] | None\n\n"
             "The Items of a ready batch's decoded \"items\" array, as ready.decode builds "
             "them; None when ready.py must (anything but the shapes it writes).");

static PyObject *ready_items(PyObject *self, PyObject *items) {
    if (!ItemType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup_ready() was not called");
        return NULL;
    }
    if (!PyList_CheckExact(items)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item;
        int rc = rd_item(PyList_GET_ITEM(items, i), &item);
        if (rc) {
            Py_DECREF(out);
            if (rc == -1 && PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;
            PyErr_Clear(); /* ready.py decodes it again and says what is wrong */
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *setup_ready(PyObject *self, PyObject *args) {
    PyObject *i, *rc, *r, *ca;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &i, &PyType_Type, &rc, &PyType_Type,
                          &r, &PyType_Type, &ca))
        return NULL;
    Py_XSETREF(ItemType, (PyTypeObject *)Py_NewRef(i));
    Py_XSETREF(RecordChangedType, (PyTypeObject *)Py_NewRef(rc));
    Py_XSETREF(RecType, (PyTypeObject *)Py_NewRef(r));
    Py_XSETREF(CursorAdvancedType, (PyTypeObject *)Py_NewRef(ca));
    if (cls_setup(&C_ITEM, ItemType) || cls_setup(&C_RC, RecordChangedType) ||
        cls_setup(&C_REC, RecType) || cls_setup(&C_CA, CursorAdvancedType))
        return NULL;
    if (!s_64 && !(s_64 = PyLong_FromLong(64))) return NULL;
    if (!s_mask64 && !(s_mask64 = PyLong_FromUnsignedLongLong(~0ULL))) return NULL;
    Py_RETURN_NONE;
}

/* ---- the change envelope of a records row: wakeline/cdc/envelope.py's parse ----
 *
 * parse_record(doc, key) builds the event envelope.parse builds for a decoded envelope of
 * a ``records`` row in the form the relay and Debezium write: every field of its exact
 * type, instants as "YYYY-MM-DDTHH:MM:SS[.f]Z", no unchanged-TOAST placeholder, no
 * transaction block, and a message key in canonical form.  For anything else it returns
 * None and envelope.py parses it (and says what is wrong with it): C accepts a subset of
 * what Python accepts, with the same result (tests/unit/cdc/test_envelope_c.py). */

static PyTypeObject *SourceType, *ReadyRecordType, *UnreadyInsertType, *RecordUpdateType,
    *RecordDeleteType;
static PyObject *j_loads; /* orjson.loads */
static Cls C_SRC = {11, {"table", "schema", "db", "connector", "name", "version", "lsn",
                         "tx_id", "ts_us", "snapshot", "prev_commit_lsn"}};
#define EV_FIELDS                                                                          \
    "op", "workspace", "entity", "source", "raw_parts", "position", "ts_ms", "transaction", \
        "_raw", "after", "before"
static Cls C_READY = {12, {EV_FIELDS, "transition"}};
static Cls C_UNREADY = {11, {EV_FIELDS}};
static Cls C_UPDATE = {11, {EV_FIELDS}};
static Cls C_DELETE = {11, {EV_FIELDS}};

enum {
    K_payload, K_schema, K_op, K_source, K_table, K_records, K_sequence, K_lsn, K_txId,
    K_ts_us, K_snapshot, K_false, K_db, K_connector, K_name, K_version, K_after, K_before,
    K_workspace, K_entity, K_seq, K_content, K_annotations, K_scores, K_ts_ms, K_transaction,
    K_collection, K_collection_version, K_type, K_status, K_key, K_text, K_tombstone,
    K_parents, K_enriched_at, K_created_at, K_active, K_empty, K_unavailable, K_COUNT
};
static const char *k_names[K_COUNT] = {
    "payload", "schema", "op", "source", "table", "records", "sequence", "lsn", "txId",
    "ts_us", "snapshot", "false", "db", "connector", "name", "version", "after", "before",
    "workspace", "entity", "seq", "content", "annotations", "scores", "ts_ms", "transaction",
    "collection", "collection_version", "type", "status", "key", "text", "tombstone",
    "parents", "enriched_at", "created_at", "active", "", "__debezium_unavailable_value"};
static PyObject *K[K_COUNT];

/* d[K[k]], borrowed; NULL when absent (an error is only possible for a str key's hash,
 * which cannot fail) */
static inline PyObject *get(PyObject *d, int k) { return PyDict_GetItemWithError(d, K[k]); }

static inline int same_str(PyObject *v, int k) {
    return PyUnicode_CheckExact(v) && PyUnicode_Compare(v, K[k]) == 0;
}

static int digits(const char *s, int n, int *out) {
    int x = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 1;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return 0;
}

static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* envelope.parse_instant of "YYYY-MM-DDTHH:MM:SS[.f{1,6}]Z" (or None): epoch seconds as
 * (micros / 10**6), which Python computes in doubles for |micros| <= 2**53 */
static int instant(PyObject *v, PyObject **out) {
    if (v == NULL || v == Py_None) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v)) return FALLBACK;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    const char *s = (const char *)PyUnicode_1BYTE_DATA(v);
    if (n < 20 || n > 27 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
        s[16] != ':' || s[n - 1] != 'Z')
        return FALLBACK;
    int y, mo, d, h, mi, se, f = 0;
    if (digits(s, 4, &y) || digits(s + 5, 2, &mo) || digits(s + 8, 2, &d) ||
        digits(s + 11, 2, &h) || digits(s + 14, 2, &mi) || digits(s + 17, 2, &se))
        return FALLBACK;
    if (n > 20) {
        int nd = (int)n - 21;
        if (s[19] != '.' || nd < 1 || digits(s + 20, nd, &f)) return FALLBACK;
        for (int i = nd; i < 6; i++) f *= 10;
    }
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] + (mo == 2 && leap) ||
        h > 23 || mi > 59 || se > 59)
        return FALLBACK;
    int64_t us = ((days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se) * 1000000) + f;
    if (us > ((int64_t)1 << 53) || us < -((int64_t)1 << 53)) return FALLBACK;
    *out = PyFloat_FromDouble((double)us / 1e6);
    return *out ? 0 : -1;
}

/* the first LSN of source.sequence, "[E,E]" with E null or a quoted decimal: an int, or
 * None (for null, or a sequence that is not text, which envelope.py ignores) */
static int sequence_prev(PyObject *seq, PyObject **out) {
    if (seq == NULL || !PyUnicode_Check(seq)) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyUnicode_CheckExact(seq) || !PyUnicode_IS_ASCII(seq)) return FALLBACK;
    Py_ssize_t n = PyUnicode_GET_LENGTH(seq);
    const char *s = (const char *)PyUnicode_1BYTE_DATA(seq);
    char first[48];
    int have_first = 0;
    Py_ssize_t i = 0;
    if (n < 2 || s[i++] != '[') return FALLBACK;
    for (int e = 0; e < 2; e++) {
        if (i + 4 <= n && memcmp(s + i, "null", 4) == 0) {
            i += 4;
        } else if (i < n && s[i] == '"') {
            Py_ssize_t j = ++i;
            while (i < n && s[i] >= '0' && s[i] <= '9') i++;
            if (i == j || i - j > 40 || i >= n || s[i] != '"') return FALLBACK;
            if (e == 0) {
                memcpy(first, s + j, i - j);
                first[i - j] = 0;
                have_first = 1;
            }
            i++;
        } else {
            return FALLBACK;
        }
        if (i >= n || s[i++] != (e == 0 ? ',' : ']')) return FALLBACK;
    }
    if (i != n) return FALLBACK;
    *out = have_first ? PyLong_FromString(first, NULL, 10) : Py_NewRef(Py_None);
    return *out ? 0 : -1;
}

/* None, or an exact int (a bool, or any other type, is envelope.py's to reject) */
static int opt_int(PyObject *v, PyObject **out) {
    if (v == NULL || v == Py_None) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyLong_CheckExact(v)) return FALLBACK;
    *out = Py_NewRef(v);
    return 0;
}

static int source_of(PyObject *src, PyObject **out) {
    PyObject *v[11] = {NULL};
    int rc = FALLBACK;
    PyObject *table = get(src, K_table);
    if (!table || !same_str(table, K_records)) return FALLBACK;
    v[0] = Py_NewRef(table);
    for (int i = 1; i < 6; i++) {
        PyObject *x = get(src, (int[]){0, K_schema, K_db, K_connector, K_name, K_version}[i]);
        v[i] = Py_NewRef(x ? x : Py_None);
    }
    if ((rc = opt_int(get(src, K_lsn), &v[6])) || (rc = opt_int(get(src, K_txId), &v[7])))
        goto fail;
    PyObject *ts = get(src, K_ts_us);
    if (!ts || !PyLong_CheckExact(ts)) {
        rc = FALLBACK;
        goto fail;
    }
    v[8] = Py_NewRef(ts);
    PyObject *snap = get(src, K_snapshot);
    if (!snap || snap == Py_None || same_str(snap, K_false)) {
        v[9] = Py_NewRef(Py_None);
    } else if (PyUnicode_CheckExact(snap)) {
        v[9] = Py_NewRef(snap);
    } else {
        rc = FALLBACK;
        goto fail;
    }
    if ((rc = sequence_prev(get(src, K_sequence), &v[10]))) goto fail;
    if (!(*out = make(SourceType, &C_SRC, v))) return -1;
    return 0;
fail:
    clear_vals(v, 11);
    return rc;
}

/* envelope._json_column of a column of the copy (in place); FALLBACK for what needs
 * envelope.py (text orjson refuses, or not an object) */
static int json_column(PyObject *row, int k) {
    PyObject *v = get(row, k), *nv;
    if (!v || PyDict_CheckExact(v)) return 0;
    if (v == Py_None) {
        nv = PyDict_New();
    } else if (PyUnicode_CheckExact(v)) {
        if (PyUnicode_GET_LENGTH(v) == 2 && PyUnicode_IS_ASCII(v) &&
            memcmp(PyUnicode_1BYTE_DATA(v), "{}", 2) == 0) {
            nv = PyDict_New();
        } else {
            if (!(nv = PyObject_CallOneArg(j_loads, v))) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
                PyErr_Clear();
                return FALLBACK;
            }
            if (nv == Py_None) {
                Py_SETREF(nv, PyDict_New());
            } else if (!PyDict_CheckExact(nv)) {
                Py_DECREF(nv);
                return FALLBACK;
            }
        }
    } else {
        return FALLBACK;
    }
    if (!nv) return -1;
    int r = PyDict_SetItem(row, K[k], nv);
    Py_DECREF(nv);
    return r;
}

/* envelope._decoded of a row (a new dict), after checking (for ``after``) that no column
 * holds the unchanged-TOAST placeholder */
static int decoded_row(PyObject *row, int check_unavailable, PyObject **out) {
    if (check_unavailable) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(row, &pos, &k, &v))
            if (same_str(v, K_unavailable)) return FALLBACK;
    }
    PyObject *c = PyDict_Copy(row);
    if (!c) return -1;
    int rc;
    if ((rc = json_column(c, K_content)) || (rc = json_column(c, K_annotations)) ||
        (rc = json_column(c, K_scores))) {
        Py_DECREF(c);
        return rc;
    }
    *out = c;
    return 0;
}

#define NONE_OR(v, check) ((v) == NULL || (v) == Py_None || (check))

/* envelope._to_rec of a decoded row, for the common row only (_to_rec's fast branch) */
static int rec_of(PyObject *row, PyObject **out) {
    PyObject *seq = get(row, K_seq), *coll = get(row, K_collection),
             *ver = get(row, K_collection_version), *typ = get(row, K_type),
             *status = get(row, K_status), *key = get(row, K_key), *text = get(row, K_text),
             *tomb = get(row, K_tombstone), *parents = get(row, K_parents),
             *content = get(row, K_content), *ann = get(row, K_annotations),
             *scores = get(row, K_scores);
    if (!seq || !PyLong_CheckExact(seq) || !coll || !PyUnicode_CheckExact(coll) ||
        !NONE_OR(ver, PyLong_CheckExact(ver)) || !NONE_OR(typ, PyUnicode_CheckExact(typ)) ||
        !NONE_OR(status, PyUnicode_CheckExact(status)) ||
        !NONE_OR(key, PyUnicode_CheckExact(key)) || !NONE_OR(text, PyUnicode_CheckExact(text)) ||
        !NONE_OR(tomb, tomb == Py_True || tomb == Py_False) || !content ||
        !PyDict_CheckExact(content) || !ann || !PyDict_CheckExact(ann) || !scores ||
        !PyDict_CheckExact(scores))
        return FALLBACK;
    if (!NONE_OR(parents, PyList_CheckExact(parents))) return FALLBACK;
    Py_ssize_t np = (parents && parents != Py_None) ? PyList_GET_SIZE(parents) : 0;
    for (Py_ssize_t i = 0; i < np; i++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(parents, i))) return FALLBACK;
    PyObject *v[14] = {NULL};
    int rc;
    if ((rc = instant(get(row, K_created_at), &v[12])) ||
        (rc = instant(get(row, K_enriched_at), &v[11]))) {
        clear_vals(v, 14);
        return rc;
    }
    if (v[12] == Py_None) {
        Py_SETREF(v[12], PyFloat_FromDouble(0.0));
        if (!v[12]) {
            clear_vals(v, 14);
            return -1;
        }
    }
    v[13] = np ? PyList_AsTuple(parents) : PyTuple_New(0);
    if (!v[13]) {
        clear_vals(v, 14);
        return -1;
    }
    v[0] = Py_NewRef(seq);
    v[1] = Py_NewRef(coll);
    v[2] = NONE_OR(ver, 0) ? PyLong_FromLong(1) : Py_NewRef(ver);
    v[3] = Py_NewRef(NONE_OR(typ, PyUnicode_GET_LENGTH(typ) == 0) ? K[K_empty] : typ);
    v[4] = Py_NewRef(NONE_OR(status, 0) ? K[K_active] : status);
    v[5] = Py_NewRef(key ? key : Py_None);
    v[6] = Py_NewRef(content);
    v[7] = Py_NewRef(NONE_OR(text, PyUnicode_GET_LENGTH(text) == 0) ? K[K_empty] : text);
    v[8] = Py_NewRef(tomb == Py_True ? Py_True : Py_False);
    v[9] = Py_NewRef(ann);
    v[10] = Py_NewRef(scores);
    *out = make(RecType, &C_REC, v);
    return *out ? 0 : -1;
}

/* the message key names (workspace, entity) in canonical form: envelope._check_key
 * accepts it (anything else, envelope.py checks) */
static int key_ok(PyObject *key, PyObject *ws, PyObject *ent) {
    if (key == Py_None) return 1;
    if (!PyBytes_CheckExact(key)) return 0;
    Py_ssize_t lw, le;
    const char *w = PyUnicode_AsUTF8AndSize(ws, &lw);
    const char *e = w ? PyUnicode_AsUTF8AndSize(ent, &le) : NULL;
    if (!e) {
        PyErr_Clear();
        return 0;
    }
    for (Py_ssize_t i = 0; i < lw; i++)
        if (w[i] == '"' || w[i] == '\\' || (unsigned char)w[i] < 0x20) return 0;
    for (Py_ssize_t i = 0; i < le; i++)
        if (e[i] == '"' || e[i] == '\\' || (unsigned char)e[i] < 0x20) return 0;
    static const char a[] = "{\"workspace\":\"", b[] = "\",\"entity\":\"", c[] = "\"}";
    Py_ssize_t la = sizeof a - 1, lb = sizeof b - 1, lc = sizeof c - 1;
    const char *k = PyBytes_AS_STRING(key);
    if (PyBytes_GET_SIZE(key) != la + lw + lb + le + lc) return 0;
    return memcmp(k, a, la) == 0 && memcmp(k + la, w, lw) == 0 &&
           memcmp(k + la + lw, b, lb) == 0 && memcmp(k + la + lw + lb, e, le) == 0 &&
           memcmp(k + la + lw + lb + le, c, lc) == 0;
}

static int is_ready(PyObject *rec) {
    return *(PyObject **)((char *)rec + C_REC.offs[11]) != Py_None;
}

static int record_event(PyObject *doc, PyObject *key, PyObject **out) {
    if (!PyDict_CheckExact(doc) || (get(doc, K_payload) && get(doc, K_schema))) return FALLBACK;
    PyObject *op = get(doc, K_op);
    if (!op || !PyUnicode_CheckExact(op) || PyUnicode_GET_LENGTH(op) != 1 ||
        !PyUnicode_IS_ASCII(op))
        return FALLBACK;
    char o = (char)PyUnicode_1BYTE_DATA(op)[0];
    if (o != 'c' && o != 'u' && o != 'd' && o != 'r') return FALLBACK;
    PyObject *src = get(doc, K_source);
    if (!src || !PyDict_CheckExact(src)) return FALLBACK;
    PyObject *after = get(doc, K_after), *before = get(doc, K_before);
    if (o == 'd') {
        if (!before || !PyDict_CheckExact(before)) return FALLBACK;
        after = NULL;
    } else {
        if (!after || !PyDict_CheckExact(after)) return FALLBACK;
        if (before == Py_None) before = NULL;
        if (before && !PyDict_CheckExact(before)) return FALLBACK;
    }
    PyObject *row = after ? after : before;
    PyObject *ws = get(row, K_workspace), *ent = get(row, K_entity), *seq = get(row, K_seq);
    if (!ws || !PyUnicode_CheckExact(ws) || !ent || !PyUnicode_CheckExact(ent) || !seq ||
        !PyLong_CheckExact(seq) || !key_ok(key, ws, ent))
        return FALLBACK;
    PyObject *tx = get(doc, K_transaction), *ts_ms = get(doc, K_ts_ms);
    if ((tx && PyDict_Check(tx)) || (ts_ms && PyBool_Check(ts_ms))) return FALLBACK;
    if (ts_ms && !PyLong_CheckExact(ts_ms)) ts_ms = NULL;

    /* v: the fields of the event, in C_READY's order */
    PyObject *v[12] = {NULL}, *a_row = NULL, *b_row = NULL, *a_rec = NULL, *b_rec = NULL,
             *prev = NULL;
    int rc;
    if ((rc = source_of(src, &v[3]))) return rc;
    if ((after && (rc = decoded_row(after, 1, &a_row))) ||
        (before && (rc = decoded_row(before, 0, &b_row))) ||
        (a_row && (rc = rec_of(a_row, &a_rec))) || (b_row && (rc = rec_of(b_row, &b_rec))))
        goto fail;
    PyObject *sv = (PyObject *)v[3];
    PyObject *snapshot = *(PyObject **)((char *)sv + C_SRC.offs[9]);
    PyObject *lsn = *(PyObject **)((char *)sv + C_SRC.offs[6]);
    prev = *(PyObject **)((char *)sv + C_SRC.offs[10]);
    if (snapshot != Py_None || o == 'r' || prev == Py_None || lsn == Py_None) {
        v[5] = PyLong_FromLong(0);
    } else if (!(v[5] = lsn_of(prev, lsn))) {
        rc = PyErr_Occurred() ? -1 : FALLBACK;
        goto fail;
    }
    PyObject *row_id = PyObject_Str(seq);
    if (!row_id || !(v[4] = PyTuple_Pack(3, row_id, a_row ? a_row : Py_None,
                                         b_row ? b_row : Py_None))) {
        Py_XDECREF(row_id);
        rc = -1;
        goto fail;
    }
    Py_DECREF(row_id);
    Py_CLEAR(a_row);
    Py_CLEAR(b_row);
    v[0] = Py_NewRef(op);
    v[1] = Py_NewRef(ws);
    v[2] = Py_NewRef(ent);
    v[6] = Py_NewRef(ts_ms ? ts_ms : Py_None);
    v[7] = Py_NewRef(Py_None);
    v[8] = Py_NewRef(Py_None);
    v[9] = a_rec ? a_rec : Py_NewRef(Py_None);
    v[10] = b_rec ? b_rec : Py_NewRef(Py_None);
    a_rec = b_rec = NULL;
    PyTypeObject *t;
    const Cls *c;
    if (o == 'd') {
        t = RecordDeleteType, c = &C_DELETE;
    } else if (!is_ready(v[9])) {
        t = (o == 'u') ? RecordUpdateType : UnreadyInsertType;
        c = (o == 'u') ? &C_UPDATE : &C_UNREADY;
    } else if (o != 'u' || v[10] == Py_None || !is_ready(v[10])) {
        t = ReadyRecordType, c = &C_READY;
        v[11] = Py_NewRef(o == 'u' ? Py_True : Py_False);
    } else {
        t = RecordUpdateType, c = &C_UPDATE;
    }
    *out = make(t, c, v);
    if (c != &C_READY) Py_XDECREF(v[11]);
    return *out ? 0 : -1;
fail:
    Py_XDECREF(a_row);
    Py_XDECREF(b_row);
    Py_XDECREF(a_rec);
    Py_XDECREF(b_rec);
    clear_vals(v, 12);
    return rc;
}

PyDoc_STRVAR(parse_record_doc,
             "parse_record(doc, key) -> event | None\n\n"
             "envelope.parse's event of a decoded envelope of a records row in the common "
             "form; None when envelope.py must parse it.");

static PyObject *parse_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse_record(doc, key)");
        return NULL;
    }
    if (!SourceType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup_envelope() was not called");
        return NULL;
    }
    PyObject *out;
    int rc = record_event(args[0], args[1], &out);
    if (rc == 0) return out;
    if (rc == -1 && PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *setup_envelope(PyObject *self, PyObject *args) {
    PyObject *s, *rr, *ui, *ru, *rd, *r, *loads;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O", &PyType_Type, &s, &PyType_Type, &rr,
                          &PyType_Type, &ui, &PyType_Type, &ru, &PyType_Type, &rd, &PyType_Type,
                          &r, &loads))
        return NULL;
    for (int i = 0; i < K_COUNT; i++)
        if (!K[i] && !(K[i] = PyUnicode_InternFromString(k_names[i]))) return NULL;
    Py_XSETREF(SourceType, (PyTypeObject *)Py_NewRef(s));
    Py_XSETREF(ReadyRecordType, (PyTypeObject *)Py_NewRef(rr));
    Py_XSETREF(UnreadyInsertType, (PyTypeObject *)Py_NewRef(ui));
    Py_XSETREF(RecordUpdateType, (PyTypeObject *)Py_NewRef(ru));
    Py_XSETREF(RecordDeleteType, (PyTypeObject *)Py_NewRef(rd));
    Py_XSETREF(RecType, (PyTypeObject *)Py_NewRef(r));
    Py_XSETREF(j_loads, Py_NewRef(loads));
    if (cls_setup(&C_SRC, SourceType) || cls_setup(&C_READY, ReadyRecordType) ||
        cls_setup(&C_UNREADY, UnreadyInsertType) || cls_setup(&C_UPDATE, RecordUpdateType) ||
        cls_setup(&C_DELETE, RecordDeleteType) || cls_setup(&C_REC, RecType))
        return NULL;
    /* every field a slot: is_ready and the position read them directly */
    if (!C_SRC.direct || !C_READY.direct || !C_UNREADY.direct || !C_UPDATE.direct ||
        !C_DELETE.direct || !C_REC.direct) {
        PyErr_SetString(PyExc_TypeError, "setup_envelope: the classes must be slotted");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *f, *d, *e, *j;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &f, &PyType_Type, &d, &PyType_Type, &e,
                          &PyType_Type, &j))
        return NULL;
    Py_XSETREF(FactType, (PyTypeObject *)Py_NewRef(f));
    Py_XSETREF(DStateType, (PyTypeObject *)Py_NewRef(d));
    Py_XSETREF(EntityStateType, (PyTypeObject *)Py_NewRef(e));
    Py_XSETREF(JobType, (PyTypeObject *)Py_NewRef(j));
    if (cls_setup(&C_FACT, FactType) || cls_setup(&C_DS, DStateType) ||
        cls_setup(&C_ST, EntityStateType) || cls_setup(&C_JOB, JobType))
        return NULL;
    Py_RETURN_NONE;
}

/* ---- outcome rows (wakeline/streams/sinks.py) ----------------------------------------------
 * copy_rows(outcomes, dumps) -> bytes | None: the COPY text of the outcomes as UTF-8, each
 * line as sinks._Rows.line writes it (the six text fields, the detail as JSON written by
 * ``dumps``, the instant's isoformat(), tab-separated, with COPY's four escapes and \N for
 * None); None when sinks.py must (anything but an exact Outcome, a text field that is not a
 * str). */

static PyTypeObject *OutcomeType;
static Cls C_OUT = {8, {"kind", "reason", "at", "workspace", "entity", "derivation", "trigger",
                        "detail"}};
static PyObject *s_isoformat;

/* COPY text of UTF-8 bytes p[0:n] */
static int put_escaped(W *w, const char *p, Py_ssize_t n) {
    if (grow(w, 2 * n)) return -1;
    unsigned char *o = w->buf + w->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        switch (c) {
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        default: *o++ = c;
        }
    }
    w->len = o - w->buf;
    return 0;
}

/* _text(s): \N for None, else the escaped str */
static int put_text(W *w, PyObject *s) {
    if (s == Py_None) return put_bytes(w, "\\N", 2);
    if (!PyUnicode_Check(s)) return FALLBACK;
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    if (!p) return -1;
    return put_escaped(w, p, n);
}

/* the detail column: "{}" when falsy, else dumps(detail) (bytes or str), escaped */
static int put_detail(W *w, PyObject *detail, PyObject *dumps) {
    int truth = PyObject_IsTrue(detail);
    if (truth < 0) return -1;
    if (!truth) return put_bytes(w, "{}", 2);
    PyObject *j = PyObject_CallOneArg(dumps, detail);
    if (!j) return -1;
    int rc;
    if (PyBytes_Check(j)) {
        rc = put_escaped(w, PyBytes_AS_STRING(j), PyBytes_GET_SIZE(j));
    } else if (PyUnicode_Check(j)) {
        rc = put_text(w, j);
    } else {
        rc = FALLBACK;
    }
    Py_DECREF(j);
    return rc;
}

PyDoc_STRVAR(copy_rows_doc,
             "copy_rows(outcomes, dumps) -> bytes | None\n\n"
             "The COPY text (UTF-8) of outcomes as sinks._Rows.line writes each line; None "
             "when sinks.py must.");

static PyObject *copy_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_rows(outcomes, dumps)");
        return NULL;
    }
    if (!OutcomeType) {
        PyErr_SetString(PyExc_RuntimeError, "_ccodec.setup_outcomes() was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "copy_rows() needs a sequence of Outcomes");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    W w = {0};
    w.cap = 160 * n + 64;
    w.buf = PyMem_Malloc(w.cap);
    PyObject *out = NULL, *last_at = NULL, *at_text = NULL;
    int rc = 0;
    if (!w.buf) {
        PyErr_NoMemory();
        rc = -1;
    }
    for (Py_ssize_t i = 0; !rc && i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i), *v[8];
        if (!Py_IS_TYPE(o, OutcomeType)) {
            rc = FALLBACK;
            break;
        }
        Attrs a = {.n = 0};
        if (fields(&a, o, &C_OUT, v)) {
            rc = -1;
        } else {
            /* the line: workspace, derivation, trigger, entity, kind, reason, detail, at */
            PyObject *text[6] = {v[3], v[5], v[6], v[4], v[0], v[1]};
            for (int k = 0; !rc && k < 6; k++) {
                rc = put_text(&w, text[k]);
                if (!rc) rc = put(&w, '\t');
            }
            if (!rc) rc = put_detail(&w, v[7], args[1]);
            if (!rc) rc = put(&w, '\t');
            if (!rc && v[2] != last_at) {
                PyObject *t = PyObject_CallMethodNoArgs(v[2], s_isoformat);
                if (!t) {
                    rc = -1;
                } else if (!PyUnicode_Check(t)) {
                    Py_DECREF(t);
                    rc = FALLBACK;
                } else {
                    Py_XSETREF(at_text, t);
                    Py_XSETREF(last_at, Py_NewRef(v[2]));
                }
            }
            if (!rc) rc = put_text(&w, at_text);
            if (!rc) rc = put(&w, '\n');
        }
        attrs_clear(&a);
    }
    if (rc == 0) {
        out = PyBytes_FromStringAndSize((const char *)w.buf, w.len);
    } else if (rc == FALLBACK) {
        out = Py_NewRef(Py_None);
    }
    Py_XDECREF(last_at);
    Py_XDECREF(at_text);
    PyMem_Free(w.buf);
    Py_DECREF(seq);
    return out;
}

static PyObject *setup_outcomes(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "setup_outcomes(Outcome)");
        return NULL;
    }
    Py_XSETREF(OutcomeType, (PyTypeObject *)Py_NewRef(cls));
    if (cls_setup(&C_OUT, OutcomeType)) return NULL;
    Py_RETURN_NONE;
}

/* layout(): for each class set up so far, whether its objects are read and built through
 * their fields' offsets (a slot or an extension type's member) rather than by name */
static PyObject *layout(PyObject *self, PyObject *unused) {
    struct { const char *name; PyTypeObject *t; const Cls *c; } all[] = {
        {"Fact", FactType, &C_FACT}, {"DState", DStateType, &C_DS},
        {"EntityState", EntityStateType, &C_ST}, {"Job", JobType, &C_JOB},
        {"Rec", RecType, &C_REC}, {"RecordChanged", RecordChangedType, &C_RC},
        {"Outcome", OutcomeType, &C_OUT}};
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!all[i].t) continue;
        if (PyDict_SetItemString(out, all[i].name, all[i].c->direct ? Py_True : Py_False) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode_body", (PyCFunction)(void (*)(void))encode_body, METH_FASTCALL, encode_body_doc},
    {"decode_body", (PyCFunction)(void (*)(void))decode_body, METH_FASTCALL, decode_body_doc},
    {"ready_items", ready_items, METH_O, ready_items_doc},
    {"ready_doc", ready_doc, METH_O, ready_doc_doc},
    {"copy_rows", (PyCFunction)(void (*)(void))copy_rows, METH_FASTCALL, copy_rows_doc},
    {"setup_outcomes", setup_outcomes, METH_O, "setup_outcomes(Outcome): the outcome class"},
    {"setup_ready", setup_ready, METH_VARARGS,
     "setup_ready(Item, RecordChanged, Rec, CursorAdvanced): the ready batch's classes"},
    {"setup", setup, METH_VARARGS, "setup(Fact, DState, EntityState, Job): the core's classes"},
    {"layout", layout, METH_NOARGS,
     "layout(): class name -> read and built through its fields' offsets, per class set up"},
    {"parse_record", (PyCFunction)(void (*)(void))parse_record, METH_FASTCALL, parse_record_doc},
    {"setup_envelope", setup_envelope, METH_VARARGS,
     "setup_envelope(Source, ReadyRecord, UnreadyInsert, RecordUpdate, RecordDelete, Rec, "
     "loads): the change envelope's classes and the JSON reader of its JSON columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wakeline.core._ccodec",
    "The state codec's hot paths in C (wakeline.core.codec is the specification).", -1,
    methods,
};

#define INTERN(var, text)                                  \
    do {                                                   \
        if (!((var) = PyUnicode_InternFromString(text))) return NULL; \
    } while (0)

PyMODINIT_FUNC PyInit__ccodec(void) {
    INTERN(s_r, "r");
    INTERN(s_a, "a");
    INTERN(s_to_bytes, "to_bytes");
    INTERN(s_little, "little");
    INTERN(s_bit_length, "bit_length");
    INTERN(s_isoformat, "isoformat");
    return PyModule_Create(&module);
}
