"""The stored form of an :class:`~wakeline.core.state.EntityState`: compact bytes.

The streaming worker keeps one value per entity in its entity store
(:mod:`wakeline.streams.statestore`, and in the store's changelog topic), framed
around ``encode_state(st)`` bytes, under the key
``<workspace>\\x1f<entity>``.  Since the key names the entity, the value does not
repeat it: :func:`decode_state` takes ``workspace`` and ``entity`` from the caller.

Forms, told apart by the first byte:

- ``{`` (or JSON whitespace): the previous form, ``json.dumps(st.to_dict())``.
  Still decoded, so a table or changelog written by an older worker loads; it
  carries its own workspace and entity.
- ``0x01``: version 1, the compact binary body below.
- ``0x02``: version 1 body, raw-deflated (only bodies over :data:`DEFLATE_OVER`
  bytes that deflate shrinks).

Version 1 body: a mask byte of the non-default sections (facts, unready, ds,
census_base, alerted, last_lsn, and whether workspace/entity are embedded), then
each present section.  Records are positional: a fact is a flag byte (tomb,
active, ready, whether key/digest are set, how ``arrived`` relates to
``created``), then its fields; a derivation state is its name, a bit mask of the
fields that differ from :class:`~wakeline.core.state.DState`'s defaults, then those
fields.  Values inside use a self-describing encoding (small ints, short strings
and short containers carry their size in the tag byte; every string is
remembered and repeated ones are one-byte back references; lowercase hex strings
are stored as their bytes; tuples stay tuples; a float is an integer when it is
one, a back reference to the previous float when equal, else the difference of
its IEEE-754 bit pattern from the previous float's — instants of one entity
share their leading bits).  Record sequence numbers and watermarks are deltas
from the previous one.  Everything is exact: ``decode_state(encode_state(st),
st.workspace, st.entity) == st``, types included (int vs float, tuple vs list,
-0.0, NaN bit patterns).

This module is the specification.  ``wakeline/core/_ccodec.c`` writes and reads the
same form ~7x faster for the core's exact shapes; :func:`encode_state` and
:func:`decode_state` use it when it was built and fall back to :func:`encode_body` /
:func:`decode_body` for anything it returns None for (tests/unit/core/test_ccodec.py
holds the two to the same bytes and states).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zlib
from typing import Any

from wakeline.core.plan import Fact
from wakeline.core.state import DState, EntityState, Job

#: The C writer and reader (``wakeline/core/_ccodec.c``), when they were built and not
#: switched off with ``WAKELINE_PURE_CODEC=1`` (benchmarks compare both in one run).
_ccodec: Any = None
_c_encode_body: Any = None
_c_decode_body: Any = None
if not os.environ.get("WAKELINE_PURE_CODEC"):
    try:
        from wakeline.core import _ccodec
    except ImportError:  # no C compiler at install time: the Python writer and reader
        pass
    else:
        _ccodec.setup(Fact, DState, EntityState, Job)
        _c_encode_body = _ccodec.encode_body
        _c_decode_body = _ccodec.decode_body

V1 = 0x01
V1_DEFLATED = 0x02
#: bodies longer than this are deflated when that makes them shorter.  zlib costs ~15 us
#: per call here whatever the level, window or size (10 B to 1 KB alike), so small bodies
#: are not worth it: at 256 the deflate was 3.5 % of a conditions worker's busy samples
#: (py-spy, bench/stream_throughput.py), to save ~70 B on the ~3 % of states of 256-400 B.
DEFLATE_OVER = 1024

# -- value tags ----------------------------------------------------------------------------
# 0x00-0x3f small int 0..63        0x40-0x5f new string, 0..31 UTF-8 bytes
# 0x60-0x6f list of 0..15          0x70-0x7f tuple of 0..15
# 0x90-0x9f dict of 0..15 pairs    0xa0-0xaf back reference to int tuple 0..15
# 0xc0-0xff back reference to string 0..63
_NONE, _FALSE, _TRUE = 0x80, 0x81, 0x82
_UINT = 0x83     # varint(v - 64)
_NINT = 0x84     # varint(-1 - v)
_FINT = 0x85     # float holding an integer: zigzag varint
_FDELTA = 0x86   # float: zigzag varint of bits - previous float's bits
_F64 = 0x87      # float: 8 bytes little endian
_FSAME = 0x88    # float: the previous float again
_STR = 0x89      # varint length, UTF-8 bytes
_SREF = 0x8A     # varint index of a string seen before
_LIST = 0x8B     # varint length, items
_TUPLE = 0x8C    # varint length, items
_DICT = 0x8D     # varint length, key/value pairs
_HEX = 0x8E      # varint byte length, bytes (a lowercase hex string)
_TUPS = 16       # tuples of ints remembered for back references (the first 16 distinct)

# -- record flags --------------------------------------------------------------------------
_F_TOMB, _F_ACTIVE, _F_READY, _F_KEY, _F_DIGEST = 1, 2, 4, 8, 16
_F_ARR_NONE, _F_ARR_OWN = 32, 64     # neither: arrived is created (same type and bits)
_F_RAW = 128                         # the dict key and all 11 fields as values

_S_FACTS, _S_UNREADY, _S_DS, _S_CENSUS, _S_ALERTED, _S_LSN, _S_IDENT = 1, 2, 4, 8, 16, 32, 64

_J_SETTLE, _J_DEDUPE, _J_DISPATCHED, _J_ID_N = 1, 2, 4, 8

_DS_FIELDS = ("w", "last_success", "handled", "last_run", "total", "queued", "running", "dead",
              "jobs_made", "cron_last", "waiting_on")

_HEX_RE = re.compile(r"(?:[0-9a-f]{2})+")
_D = struct.Struct("<d")
_Q = struct.Struct("<q")
_MAX_EXACT = 2.0 ** 53
_INT_ONLY = frozenset({int})


def _bits(x: float) -> int:
    return _Q.unpack(_D.pack(x))[0]


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _bits(a) == _bits(b)
    return bool(a == b)


class _Writer:
    __slots__ = ("out", "strs", "tups", "tupid", "fbits", "reg")

    def __init__(self) -> None:
        self.out = bytearray()
        self.strs: dict[str, int] = {}
        self.tups: dict[tuple[int, ...], int] = {}
        # id -> (the tuple, its index in tups): facts share their drive tuple objects, so
        # a repeat is found without re-checking its items.  Holding the tuple keeps its
        # id from being reused while this writer lives.
        self.tupid: dict[int, tuple[tuple[int, ...], int]] = {}
        self.fbits: int | None = None  # previous non-integral float's bit pattern
        self.reg = 0  # previous sequence number / watermark

    def uvar(self, n: int) -> None:
        out = self.out
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)

    def val(self, v: Any) -> None:
        t = type(v)
        out = self.out
        if t is str:
            idx = self.strs.get(v)
            if idx is not None:
                if idx < 64:
                    out.append(0xC0 | idx)
                else:
                    out.append(_SREF)
                    self.uvar(idx)
                return
            self.strs[v] = len(self.strs)
            if len(v) >= 8 and _HEX_RE.fullmatch(v):
                out.append(_HEX)
                self.uvar(len(v) >> 1)
                out += bytes.fromhex(v)
                return
            b = v.encode("utf-8", "surrogatepass")
            n = len(b)
            if n < 32:
                out.append(0x40 | n)
            else:
                out.append(_STR)
                self.uvar(n)
            out += b
        elif t is int:
            if 0 <= v < 64:
                out.append(v)
            elif v >= 64:
                out.append(_UINT)
                self.uvar(v - 64)
            else:
                out.append(_NINT)
                self.uvar(-1 - v)
        elif t is float:
            self.flt(v)
        elif v is None:
            out.append(_NONE)
        elif t is bool:
            out.append(_TRUE if v else _FALSE)
        elif t is tuple and (hit := self.tupid.get(id(v))) is not None and hit[0] is v:
            out.append(0xA0 | hit[1])
        elif t is tuple and {*map(type, v)} <= _INT_ONLY and (
                v in self.tups or len(self.tups) < _TUPS):
            idx = self.tups.get(v)
            if idx is not None:
                self.tupid[id(v)] = (v, idx)
                out.append(0xA0 | idx)
                return
            idx = self.tupid[id(v)] = (v, len(self.tups))
            self.tups[v] = idx[1]
            n = len(v)
            if n < 16:
                out.append(0x70 | n)
            else:
                out.append(_TUPLE)
                self.uvar(n)
            for x in v:
                self.val(x)
        elif t is list or t is tuple:
            n = len(v)
            if n < 16:
                out.append((0x60 if t is list else 0x70) | n)
            else:
                out.append(_LIST if t is list else _TUPLE)
                self.uvar(n)
            for x in v:
                self.val(x)
        elif t is dict:
            self.dict_(v)
        elif isinstance(v, bool):
            self.val(bool(v))
        elif isinstance(v, str):
            self.val(str(v))
        elif isinstance(v, int):
            self.val(int(v))
        elif isinstance(v, float):
            self.val(float(v))
        elif isinstance(v, list):
            self.val(list(v))
        elif isinstance(v, tuple):
            self.val(tuple(v))
        elif isinstance(v, dict):
            self.dict_(v)
        else:
            raise TypeError(f"cannot encode {t.__name__} in an entity state")

    def flt(self, v: float) -> None:
        out = self.out
        if v.is_integer() and -_MAX_EXACT < v < _MAX_EXACT and (
                v != 0 or math.copysign(1.0, v) > 0):  # not -0.0
            out.append(_FINT)
            i = int(v)
            self.uvar(i << 1 if i >= 0 else ((-i) << 1) - 1)
            return
        bits = _Q.unpack(_D.pack(v))[0]
        prev = self.fbits
        self.fbits = bits
        if prev is not None:
            if bits == prev:
                out.append(_FSAME)
                return
            d = bits - prev
            z = d << 1 if d >= 0 else ((-d) << 1) - 1
            if z < 1 << 49:  # at most 7 varint bytes
                out.append(_FDELTA)
                self.uvar(z)
                return
        out.append(_F64)
        out += _D.pack(v)

    def dict_(self, v: dict[Any, Any]) -> None:
        n = len(v)
        if n < 16:
            self.out.append(0x90 | n)
        else:
            self.out.append(_DICT)
            self.uvar(n)
        for k, x in v.items():
            self.val(k)
            self.val(x)

    def seq(self, s: Any) -> None:
        """A sequence number or watermark: the delta from the previous one when an int."""
        if type(s) is int:
            self.val(s - self.reg)
            self.reg = s
        else:  # not an int (never made by the core): a tagged value, then the delta base
            self.out.append(_NONE)
            self.val(s)

    def fact(self, k: Any, f: Fact) -> None:
        tomb, active, ready = f.tomb, f.active, f.ready
        if (type(tomb) is not bool or type(active) is not bool or type(ready) is not bool
                or type(f.seq) is not int or k != f.seq or type(k) is not int):
            self.out.append(_F_RAW)
            for x in (k, f.seq, f.coll, f.key, f.tomb, f.active, f.digest, f.ready, f.arrived,
                      f.created, f.drive, f.cond):
                self.val(x)
            return
        key, digest, arrived, created = f.key, f.digest, f.arrived, f.created
        flags = (_F_TOMB if tomb else 0) | (_F_ACTIVE if active else 0) | (_F_READY if ready else 0)
        if key is not None:
            flags |= _F_KEY
        if not (type(digest) is str and digest == ""):
            flags |= _F_DIGEST
        if arrived is None:
            flags |= _F_ARR_NONE
        elif arrived is not created and not (
                # equal non-zero floats have the same bits (0.0 == -0.0, NaN != NaN)
                type(arrived) is float and type(created) is float and arrived == created
                and arrived) and not _same(arrived, created):
            flags |= _F_ARR_OWN
        # The common shapes are written inline; anything else goes through val().
        out = self.out
        out.append(flags)
        d = k - self.reg  # k is f.seq, an int (checked above)
        self.reg = k
        if 0 <= d < 64:
            out.append(d)
        else:
            self.val(d)
        coll = f.coll
        idx = self.strs.get(coll) if type(coll) is str else None
        if idx is not None and idx < 64:
            out.append(0xC0 | idx)
        else:
            self.val(coll)
        if flags & _F_KEY:
            self.val(key)
        if flags & _F_DIGEST:
            self.val(digest)
        if type(created) is float:
            self.flt(created)
        else:
            self.val(created)
        if flags & _F_ARR_OWN:
            self.val(arrived)
        drive = f.drive
        hit = self.tupid.get(id(drive))
        if hit is not None and hit[0] is drive:
            out.append(0xA0 | hit[1])
        else:
            self.val(drive)
        cond = f.cond
        if type(cond) is dict and len(cond) < 16:
            out.append(0x90 | len(cond))
            for ck, cv in cond.items():
                if type(ck) is int and 0 <= ck < 64:
                    out.append(ck)
                else:
                    self.val(ck)
                if cv is True:
                    out.append(_TRUE)
                elif type(cv) is float:
                    self.flt(cv)
                else:
                    self.val(cv)
        else:
            self.val(cond)

    def job(self, j: Job, st: EntityState, name: str) -> None:
        if not isinstance(j, Job):
            raise TypeError(f"a mailbox holds {type(j).__name__}, not a Job")
        mask = 0
        if not (type(j.settle) is list and not j.settle):
            mask |= _J_SETTLE
        if not (type(j.dedupe) is list and not j.dedupe):
            mask |= _J_DEDUPE
        if j.dispatched is not None:
            mask |= _J_DISPATCHED
        prefix = f"{st.workspace}/{name}/{st.entity}/"
        n: int | None = None
        if type(j.id) is str and j.id.startswith(prefix):
            tail = j.id[len(prefix):]
            if tail.isascii() and tail.isdigit() and str(int(tail)) == tail:
                n = int(tail)
                mask |= _J_ID_N
        self.out.append(mask)
        self.val(n if n is not None else j.id)
        self.val(j.reasons)
        self.val(j.created)
        if mask & _J_SETTLE:
            self.val(j.settle)
        if mask & _J_DEDUPE:
            self.val(j.dedupe)
        if mask & _J_DISPATCHED:
            self.val(j.dispatched)

    def dstate(self, st: EntityState, name: str, d: DState) -> None:
        idx = self.strs.get(name) if type(name) is str else None
        if idx is not None and idx < 64:
            self.out.append(0xC0 | idx)
        else:
            self.val(name)
        w, total, jobs_made, dead, cron = d.w, d.total, d.jobs_made, d.dead, d.cron_last
        mask = 0
        if not (type(w) is int and w == 0):
            mask |= 1
        if d.last_success is not None:
            mask |= 2
        if d.handled is not None:
            mask |= 4
        if d.last_run is not None:
            mask |= 8
        if not (type(total) is int and total == 0):
            mask |= 16
        if d.queued is not None:
            mask |= 32
        if d.running is not None:
            mask |= 64
        if dead is not False:
            mask |= 128
        if not (type(jobs_made) is int and jobs_made == 0):
            mask |= 256
        if not (type(cron) is dict and not cron):
            mask |= 512
        if d.waiting_on is not None:
            mask |= 1024
        self.uvar(mask)
        if mask & 1:
            self.seq(w)
        if mask & 14:
            for bit, x in ((2, d.last_success), (4, d.handled), (8, d.last_run)):
                if mask & bit:
                    if type(x) is float:
                        self.flt(x)
                    else:
                        self.val(x)
        if mask & 16:
            if type(total) is int and 0 <= total < 64:
                self.out.append(total)
            else:
                self.val(total)
        if mask & 32:
            self.job(d.queued, st, name)  # type: ignore[arg-type]
        if mask & 64:
            self.job(d.running, st, name)  # type: ignore[arg-type]
        if mask & 128:
            self.val(dead)
        if mask & 256:
            self.val(jobs_made)
        if mask & 512:
            self.val(cron)
        if mask & 1024:
            self.val(d.waiting_on)


def encode_state(st: EntityState, *, identity: bool = False) -> bytes:
    """The compact stored form of ``st`` (version 1, deflated when large).

    Workspace and entity are left out (the table key names them) unless
    ``identity`` is set.  The body comes from the C writer when it is built and
    handles ``st`` (it returns None for anything but the core's exact shapes), else
    from :func:`encode_body`; the bytes are the same."""
    body = _c_encode_body(st, identity) if _c_encode_body is not None else None
    if body is None:
        body = encode_body(st, identity)
    return deflated(body)


def deflated(body: bytes | bytearray) -> bytes:
    """The stored bytes of a version-1 body: deflated (raw deflate after a
    ``V1_DEFLATED`` head) when it is over ``DEFLATE_OVER`` bytes and that is smaller."""
    if len(body) > DEFLATE_OVER:
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        packed = c.compress(memoryview(body)[1:]) + c.flush()
        if len(packed) + 1 < len(body):
            return bytes([V1_DEFLATED]) + packed
    return bytes(body)


def inflated(data: bytes) -> bytes:
    """The version-1 body of stored bytes (:func:`deflated` undone)."""
    if data[0] == V1_DEFLATED:
        return bytes([V1]) + zlib.decompress(memoryview(data)[1:], -15)
    return bytes(data)


def encode_body(st: EntityState, identity: bool = False) -> bytearray:
    """The version-1 body of ``st``, not deflated: the specification of the C writer."""
    w = _Writer()
    out = w.out
    mask = 0
    if identity:
        mask |= _S_IDENT
    if st.facts:
        mask |= _S_FACTS
    if st.unready:
        mask |= _S_UNREADY
    if st.ds:
        mask |= _S_DS
    if st.census_base:
        mask |= _S_CENSUS
    if not (type(st.alerted) is list and not st.alerted):
        mask |= _S_ALERTED
    if not (type(st.last_lsn) is int and st.last_lsn == 0):
        mask |= _S_LSN
    out.append(V1)
    out.append(mask)
    if identity:
        w.val(st.workspace)
        w.val(st.entity)
    if mask & _S_FACTS:
        w.uvar(len(st.facts))
        for k, f in st.facts.items():
            w.fact(k, f)
    if mask & _S_UNREADY:
        w.uvar(len(st.unready))
        for s, v in st.unready.items():
            w.seq(s)
            w.val(v)
    if mask & _S_DS:
        w.uvar(len(st.ds))
        for name, d in st.ds.items():
            w.dstate(st, name, d)
    if mask & _S_CENSUS:
        w.val(st.census_base)
    if mask & _S_ALERTED:
        w.val(st.alerted)
    if mask & _S_LSN:
        w.val(st.last_lsn)
    return out


class _Reader:
    __slots__ = ("data", "pos", "strs", "tups", "fbits", "reg")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos
        self.strs: list[str] = []
        self.tups: list[tuple[int, ...]] = []
        self.fbits: int | None = None
        self.reg = 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def uvar(self) -> int:
        data = self.data
        p = self.pos
        b = data[p]
        if b < 0x80:
            self.pos = p + 1
            return b
        p += 1
        n = b & 0x7F
        shift = 7
        while b & 0x80:
            b = data[p]
            p += 1
            n |= (b & 0x7F) << shift
            shift += 7
        self.pos = p
        return n

    def _str(self, n: int) -> str:
        p = self.pos
        end = p + n
        if end > len(self.data):
            raise ValueError("truncated state")
        s = self.data[p:end].decode("utf-8", "surrogatepass")
        self.pos = end
        self.strs.append(s)
        return s

    def _tuple(self, n: int) -> tuple[Any, ...]:
        data = self.data
        p = self.pos
        chunk = data[p:p + n]
        if len(chunk) == n and (not n or max(chunk) < 0x40):  # small ints: the bytes are the values
            self.pos = p + n
            tup: tuple[Any, ...] = tuple(chunk)
        else:
            tup = tuple([self.val() for _ in range(n)])
        if len(self.tups) < _TUPS and all(type(x) is int for x in tup):
            self.tups.append(tup)
        return tup

    def val(self) -> Any:
        data = self.data
        p = self.pos
        t = data[p]
        self.pos = p + 1
        if t < 0x40:
            return t
        if t >= 0xC0:
            return self.strs[t - 0xC0]
        if t >= 0x80:
            if t < 0x90:
                return _OPS[t - 0x80](self)
            if t < 0xA0:
                return self._dict(t - 0x90)
            if t < 0xA0 + _TUPS:
                return self.tups[t - 0xA0]
            raise ValueError(f"bad value tag 0x{t:02x} in a stored state")
        if t < 0x60:
            return self._str(t - 0x40)
        if t < 0x70:
            return [self.val() for _ in range(t - 0x60)]
        return self._tuple(t - 0x70)

    def _fsame(self) -> float:
        if self.fbits is None:
            raise ValueError("float back reference without a float")
        return _D.unpack(_Q.pack(self.fbits))[0]  # type: ignore[no-any-return]

    def _fdelta(self) -> float:
        if self.fbits is None:
            raise ValueError("float delta without a float")
        z = self.uvar()
        bits = self.fbits + (z >> 1 if not z & 1 else -((z + 1) >> 1))
        self.fbits = bits
        return _D.unpack(_Q.pack(bits))[0]  # type: ignore[no-any-return]

    def _f64(self) -> float:
        p = self.pos
        x: float = _D.unpack_from(self.data, p)[0]
        self.fbits = _Q.unpack_from(self.data, p)[0]
        self.pos = p + 8
        return x

    def _fint(self) -> float:
        z = self.uvar()
        return float(z >> 1 if not z & 1 else -((z + 1) >> 1))

    def _uint(self) -> int:
        return self.uvar() + 64

    def _nint(self) -> int:
        return -1 - self.uvar()

    def _lstr(self) -> str:
        return self._str(self.uvar())

    def _sref(self) -> str:
        return self.strs[self.uvar()]

    def _hex(self) -> str:
        n = self.uvar()
        p = self.pos
        if p + n > len(self.data):
            raise ValueError("truncated state")
        s = self.data[p:p + n].hex()
        self.pos = p + n
        self.strs.append(s)
        return s

    def _llist(self) -> list[Any]:
        return [self.val() for _ in range(self.uvar())]

    def _ltuple(self) -> tuple[Any, ...]:
        return self._tuple(self.uvar())

    def _ldict(self) -> dict[Any, Any]:
        return self._dict(self.uvar())

    def _bad(self) -> Any:
        raise ValueError(f"bad value tag 0x{self.data[self.pos - 1]:02x} in a stored state")

    def _dict(self, n: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(n):
            k = self.val()
            out[k] = self.val()
        return out

    def seq(self) -> Any:
        if self.data[self.pos] == _NONE:
            self.pos += 1
            return self.val()
        s: int = self.reg + self.val()
        self.reg = s
        return s

    def fact(self) -> tuple[Any, Fact]:
        flags = self.byte()
        if flags == _F_RAW:
            k = self.val()
            f = Fact(*[self.val() for _ in range(11)])
            return k, f
        seq = self.seq()
        coll = self.val()
        key = self.val() if flags & _F_KEY else None
        digest = self.val() if flags & _F_DIGEST else ""
        created = self.val()
        if flags & _F_ARR_NONE:
            arrived = None
        elif flags & _F_ARR_OWN:
            arrived = self.val()
        else:
            arrived = created
        drive = self.val()
        cond = self.val()
        return seq, Fact(seq, coll, key, bool(flags & _F_TOMB), bool(flags & _F_ACTIVE), digest,
                         bool(flags & _F_READY), arrived, created, drive, cond)

    def job(self, workspace: str | None, entity: str | None, name: str) -> Job:
        mask = self.byte()
        jid = self.val()
        if mask & _J_ID_N:
            if workspace is None or entity is None:
                raise ValueError("a compact state needs its workspace and entity to decode")
            jid = f"{workspace}/{name}/{entity}/{jid}"
        reasons = self.val()
        created = self.val()
        settle = self.val() if mask & _J_SETTLE else []
        dedupe = self.val() if mask & _J_DEDUPE else []
        dispatched = self.val() if mask & _J_DISPATCHED else None
        return Job(jid, reasons, created, settle, dedupe, dispatched)

    def dstate(self, workspace: str | None, entity: str | None) -> tuple[Any, DState]:
        name = self.val()
        mask = self.uvar()
        d = DState()
        if mask & 1:
            d.w = self.seq()
        if mask & 2:
            d.last_success = self.val()
        if mask & 4:
            d.handled = self.val()
        if mask & 8:
            d.last_run = self.val()
        if mask & 16:
            d.total = self.val()
        if mask & 32:
            d.queued = self.job(workspace, entity, name)
        if mask & 64:
            d.running = self.job(workspace, entity, name)
        if mask & 128:
            d.dead = self.val()
        if mask & 256:
            d.jobs_made = self.val()
        if mask & 512:
            d.cron_last = self.val()
        if mask & 1024:
            d.waiting_on = self.val()
        return name, d


_OPS = (
    lambda r: None, lambda r: False, lambda r: True, _Reader._uint, _Reader._nint, _Reader._fint,
    _Reader._fdelta, _Reader._f64, _Reader._fsame, _Reader._lstr, _Reader._sref, _Reader._llist,
    _Reader._ltuple, _Reader._ldict, _Reader._hex, _Reader._bad,
)


def decode_state(data: bytes, workspace: str | None = None,
                 entity: str | None = None) -> EntityState:
    """An :class:`EntityState` from its stored bytes, current or previous form.

    The compact form does not carry the entity's identity: pass the
    ``workspace`` and ``entity`` of its table key.  The previous (JSON) form
    carries its own, which wins."""
    if not data:
        raise ValueError("empty stored state")
    head = data[0]
    if head in b"{ \t\r\n":
        return EntityState.from_dict(json.loads(data))
    if head not in (V1, V1_DEFLATED):
        raise ValueError(f"unknown stored state version 0x{head:02x}")
    try:
        data = inflated(data)
        if _c_decode_body is not None:
            # the C reader, or None for what only this module reads (or what is corrupt:
            # _decode_v1 says what is wrong with it)
            st = _c_decode_body(data, workspace, entity)
            if st is not None:
                return st  # type: ignore[no-any-return]
        return _decode_v1(_Reader(data, 1), workspace, entity)
    except (IndexError, struct.error, UnicodeDecodeError, zlib.error) as exc:
        raise ValueError(f"corrupt stored state: {exc}") from exc


def decode_body(data: bytes, workspace: str | None = None,
                entity: str | None = None) -> EntityState:
    """The state of version-1 ``data`` (its first byte the version) read by this module:
    the specification of the C reader."""
    try:
        return _decode_v1(_Reader(data, 1), workspace, entity)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt stored state: {exc}") from exc


def _decode_v1(r: _Reader, workspace: str | None, entity: str | None) -> EntityState:
    mask = r.byte()
    if mask & _S_IDENT:
        workspace, entity = r.val(), r.val()
    if workspace is None or entity is None:
        raise ValueError("a compact state needs its workspace and entity to decode")
    st = EntityState(workspace, entity)
    if mask & _S_FACTS:
        facts = st.facts
        for _ in range(r.uvar()):
            k, f = r.fact()
            facts[k] = f
    if mask & _S_UNREADY:
        unready = st.unready
        for _ in range(r.uvar()):
            s = r.seq()
            unready[s] = r.val()
    if mask & _S_DS:
        ds = st.ds
        for _ in range(r.uvar()):
            name, d = r.dstate(workspace, entity)
            ds[name] = d
    if mask & _S_CENSUS:
        st.census_base = r.val()
    if mask & _S_ALERTED:
        st.alerted = r.val()
    if mask & _S_LSN:
        st.last_lsn = r.val()
    if r.pos != len(r.data):
        raise ValueError("trailing bytes after a stored state")
    return st


__all__ = ["DEFLATE_OVER", "decode_state", "encode_state"]
