"""Batched writes of typed outcomes to PostgreSQL (invariant 8), off the event loop.

``OutcomeWriter.put`` never blocks the stream: it hands a batch's outcomes over as
one chunk (one lock round, not one queue operation per outcome) to a background
thread, which writes them with one COPY per up to ``batch`` rows (about 10x the
rows/s of a multi-row INSERT here, and far less of the process's GIL).  The thread
formats the COPY text itself (:meth:`_Rows.line`, or ``_ccodec.copy_rows`` in C,
the same bytes) instead of adapting each row's Python values with psycopg's
``write_row``.

Nothing is lost silently: when more than ``maxsize`` outcomes wait, the newest are
counted in ``dropped``; a batch PostgreSQL refuses is retried row by row on a new
connection and the rows refused alone are counted too.  Every count is recorded as
an outcome of kind ``outcomes_dropped`` with the next write, so even overload is
observable.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson
import psycopg

from wakeline.core import codec
from wakeline.core.outcomes import Outcome, OutcomeKind

log = logging.getLogger(__name__)

_COPY = ("COPY outcomes (workspace, derivation, trigger, entity, kind, reason, detail, at) "
         "FROM STDIN")
# COPY's text format: these four characters are escaped, NULL is \N
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _dumps(detail: Any) -> bytes | str:
    """An outcome's detail as JSON: orjson (2.8 -> 0.6 us per detail; a conditions
    worker records ~1.6 outcomes per change), json.dumps for what orjson refuses."""
    try:
        return orjson.dumps(detail, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(detail)


def _text(s: str | None) -> str:
    """One COPY text field."""
    if s is None:
        return "\\N"
    if "\\" in s or "\t" in s or "\n" in s or "\r" in s:
        return s.translate(_ESCAPES)
    return s


class _Rows:
    """Formats outcomes as COPY text lines; remembers the last instant it formatted
    (the core stamps every outcome of one evaluation with the same datetime)."""

    __slots__ = ("_at", "_at_text")

    def __init__(self) -> None:
        self._at: datetime | None = None
        self._at_text = ""

    def line(self, o: Outcome) -> str:
        at = o.at
        if at is not self._at:
            self._at, self._at_text = at, at.isoformat()
        detail = o.detail
        if detail:
            d = _dumps(detail)
            dj = _text(d.decode() if isinstance(d, bytes) else d)
        else:
            dj = "{}"
        ws, dv, tr, en, kind, reason = (o.workspace, o.derivation, o.trigger, o.entity, o.kind,
                                        o.reason)
        if dv is not None and tr is not None and ws is not None and en is not None:
            # The common row: no NULL; its six text fields checked for an escape at once
            # (one join and four scans instead of six calls of _text).
            head = "\t".join((ws, dv, tr, en, kind, reason))
            if head.count("\t") == 5 and "\\" not in head and "\n" not in head \
                    and "\r" not in head:
                return f"{head}\t{dj}\t{self._at_text}\n"
        return "\t".join((_text(ws), _text(dv), _text(tr), _text(en), _text(kind),
                          _text(reason), dj, self._at_text)) + "\n"


class OutcomeWriter:
    def __init__(self, dsn: str, *, batch: int = 5000, interval: float = 0.25,
                 maxsize: int = 200_000, on_outcome: Callable[[Outcome], None] | None = None
                 ) -> None:
        self.dsn = dsn
        self.batch = batch
        self.interval = interval
        self.maxsize = maxsize
        self.on_outcome = on_outcome
        self.written = 0
        self.dropped = 0      # outcomes lost, all of them also recorded as a count
        self._unreported = 0  # of those, not yet recorded
        self._lost_at: datetime | None = None  # the instant of the newest lost outcome
        self._chunks: deque[list[Outcome]] = deque()
        self._pending = 0
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="outcomes", daemon=True)
        self._thread.start()

    def put(self, outcomes: Iterable[Outcome]) -> None:
        chunk = list(outcomes)
        if not chunk:
            return
        if self.on_outcome is not None:
            for o in chunk:
                self.on_outcome(o)
        with self._cv:
            room = self.maxsize - self._pending
            if room < len(chunk):
                keep = max(room, 0)
                self._lost(chunk[keep:])
                chunk = chunk[:keep]
                if not chunk:
                    return
            self._chunks.append(chunk)
            self._pending += len(chunk)
            self._cv.notify()

    def _lost(self, outcomes: list[Outcome]) -> None:
        """Count outcomes that cannot be recorded (call holding ``_cv``)."""
        self.dropped += len(outcomes)
        self._unreported += len(outcomes)
        self._lost_at = outcomes[-1].at

    def _drain(self) -> list[Outcome]:
        """Up to about ``batch`` outcomes (whole chunks), waiting ``interval`` at most."""
        with self._cv:
            if not self._chunks and not self._stop.is_set():
                self._cv.wait(self.interval)
            items: list[Outcome] = []
            while self._chunks and len(items) < self.batch:
                items += self._chunks.popleft()
            self._pending -= len(items)
            return items

    def _loop(self) -> None:
        conn: psycopg.Connection | None = None  # type: ignore[type-arg]
        rows = _Rows()
        try:
            while True:
                stopping = self._stop.is_set()  # then this round writes what is left
                items = self._drain()
                if self._unreported:
                    with self._cv:
                        n, self._unreported, at = self._unreported, 0, self._lost_at
                    assert at is not None
                    items.append(_dropped_outcome(n, at))
                if items:
                    conn = self._write(conn, rows, items)
                if stopping and not self._chunks:
                    break
        finally:
            if conn is not None:
                conn.close()

    def _write(self, conn: psycopg.Connection | None, rows: _Rows,  # type: ignore[type-arg]
               items: list[Outcome]) -> psycopg.Connection | None:  # type: ignore[type-arg]
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(self.dsn, autocommit=True)
            _copy(conn, copy_text(rows, items))
            self.written += len(items)
            return conn
        except Exception as exc:  # noqa: BLE001 - the stream must not lose the thread
            log.warning("outcome batch of %d rows refused (%s); writing row by row",
                        len(items), exc)
        lost: list[Outcome] = []
        for o in items:
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.dsn, autocommit=True)
                _copy(conn, rows.line(o))
                self.written += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("outcome row refused: %s: %s", type(exc).__name__, exc)
                lost.append(o)
        if lost:
            with self._cv:
                self._lost(lost)
        return conn

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        self._thread.join(timeout)


def copy_text(rows: _Rows, items: list[Outcome]) -> bytes:
    """The COPY text of ``items``: written in C (``_ccodec.copy_rows``, ~5x faster) when
    it was built, else by ``rows``; the same bytes (tests/unit/test_outcome_sink.py)."""
    data = _c_rows(items, _dumps) if _c_rows is not None else None
    if data is None:
        data = "".join([rows.line(o) for o in items]).encode("utf-8")
    return data


def _copy(conn: psycopg.Connection, text: str | bytes) -> None:  # type: ignore[type-arg]
    with conn.cursor() as cur, cur.copy(_COPY) as copy:
        copy.write(text.encode("utf-8") if isinstance(text, str) else text)


def _dropped_outcome(n: int, at: datetime) -> Outcome:
    return Outcome(OutcomeKind.OUTCOMES_DROPPED,
                   f"{n} outcome(s) could not be recorded (writer queue full or rows refused)",
                   at, detail={"count": n})


#: The C writer of COPY rows (``wakeline/core/_ccodec.c``), unless it was not built or
#: ``WAKELINE_PURE_CODEC=1`` switches it off; :meth:`_Rows.line` is its specification.
_c_rows: Any = None
if codec._ccodec is not None:
    codec._ccodec.setup_outcomes(Outcome)
    _c_rows = codec._ccodec.copy_rows
