"""The codecs with a C side: entity states (µs per state to encode and decode), ready
batches (µs per change to decode) and change envelopes (µs per envelope to parse), C
against the Python specification.

States: what the core holds after the mixed workload of bench/core_throughput.py (N
entities, 4 records each, runs completing). Every state is encoded by both writers,
which must give the same bytes, and read back by both readers, which must give the same
states; then each pass is timed over all states (min of ``--repeat``, the GC as the worker
tunes it). Reference in the same run: the pure-Python writer and reader
(``codec.encode_body`` / ``codec.decode_body``, what ``encode_state`` / ``decode_state`` ran
before the C side), with the same deflate step. Ready batches: the workload's records as
the readiness stage forwards them (batches of 1,000 changes), decoded by ``ready.decode``
with the C item decoder and with ``ready.decode_items``; the Items must be equal. Change
envelopes: the workload's records as the relay writes them (``cdc.compose``: records rows
with JSON columns as text, ready inserts), parsed by ``envelope.parse`` with and without its
C parser; the events must be equal. Relay compose: the same records as pgoutput text tuples
turned into a Debezium row, key and envelope (``TableCodec.row`` / ``key``, ``envelope``) by
the relay's hot path (orjson, UTC timestamps rearranged) against its specification in the
same run (the ``json`` encoder, every timestamp parsed); the bytes must be equal.

    python bench/codec.py [--entities 20000] [--repeat 5] [--tiny]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_catalog  # noqa: E402
from core_throughput import run_core, to_rec, workload  # noqa: E402

from wakeline.cdc import envelope  # noqa: E402
from wakeline.cdc._json import dumpb, dumps, loads  # noqa: E402
from wakeline.cdc.compose import SourceTemplate  # noqa: E402
from wakeline.cdc.compose import envelope as compose_envelope  # noqa: E402
from wakeline.core import codec  # noqa: E402
from wakeline.core.events import RecordChanged  # noqa: E402
from wakeline.core.state import EntityState  # noqa: E402
from wakeline.streams import ready  # noqa: E402


def timed(fn: Callable[[Any], Any], items: list[Any], repeat: int) -> float:
    """Seconds per item, the best of ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, time.perf_counter() - t0)
    return best / len(items)


def python_encode(st: EntityState) -> bytes:
    """encode_state with the Python writer (the same deflate step)."""
    return codec.deflated(codec.encode_body(st))


def python_decode(k: tuple[bytes, str, str]) -> EntityState:
    """decode_state with the Python reader (the same inflate step)."""
    data, ws, ent = k
    return codec.decode_body(codec.inflated(data), ws, ent)


def ready_batches(stream: list[tuple[str, bytes]]) -> tuple[list[bytes], int]:
    """The stream's records as ready batches of 1,000 changes, and how many changes."""
    import json

    items = [ready.Item(b"default\x1f" + ent.encode(), "default", ent, n,
                        [RecordChanged("c", to_rec(json.loads(raw), 1.7e9 + n), None,
                                       (5 << 64) | n)])
             for n, (ent, raw) in enumerate(stream)]
    return [ready.encode(0, items[i:i + 1000]) for i in range(0, len(items), 1000)], len(items)


def timed_kept(fn: Callable[[bytes], Any], batches: list[bytes], repeat: int) -> float:
    """Seconds per batch of ``fn``, the results kept until the pass ends (as the agent
    keeps a take's Items), so freeing them is not in the time."""
    best = float("inf")
    for _ in range(repeat):
        copies = [bytes(bytearray(b)) for b in batches]  # as the agent receives them
        held = []
        t0 = time.perf_counter()
        for b in copies:
            held.append(fn(b))
        best = min(best, time.perf_counter() - t0)
        del held
    return best / len(batches)


def timed_handoff(batches: list[bytes], repeat: int) -> float:
    """:func:`timed_kept` of ``ready.decode`` when each batch was kept in a Handoff, as
    a one-process worker's readiness stage keeps what it writes: the agent's message
    is another bytes object with the same contents (hashed, compared)."""
    best = float("inf")
    for _ in range(repeat):
        h = ready.Handoff(max_changes=len(batches) * 1000)
        h.own({0})
        for b in batches:
            p, items, t = ready.decode(b)
            h.put(b, p, items, None if t is None else round(t * 1000))
        best = min(best, timed_kept(lambda b, h=h: ready.decode(b, h), batches, 1))
        if h.taken != len(batches):
            sys.exit(f"the hand-off returned {h.taken} of {len(batches)} batches")
    return best


def python_ready(batch: bytes) -> list[ready.Item]:
    """ready.decode's items with the Python decoder."""
    return ready.decode_items(loads(batch)["items"])


def envelopes(stream: list[tuple[str, bytes]]) -> list[tuple[bytes, bytes]]:
    """The stream's records as the relay's (value, key) of a ready insert each."""
    import json

    out = []
    template = SourceTemplate(db="wakeline")
    lsn = 0x16B3_0000
    for ent, raw in stream:
        r = json.loads(raw)
        lsn += 200
        row = {"seq": r["seq"], "workspace": "default", "entity": ent,
               "collection": r["collection"], "collection_version": 1, "type": r.get("type", ""),
               "status": "active", "key": r.get("key"), "content": dumps(r["content"]),
               "text": "", "tombstone": False, "parents": None, "annotations": "{}",
               "scores": dumps(r.get("scores", {})),
               "enriched_at": "2026-12-06T14:07:04.123456Z",
               "created_at": "2026-12-06T14:07:04.120001Z", "produced_by_run": None}
        src = template.block(schema="public", table="records", ts_us=1_796_566_024_123_456,
                             tx_id=700 + r["seq"], lsn=lsn, prev_commit_lsn=lsn - 200,
                             snapshot=None)
        out.append((compose_envelope("c", None, row, src, 1_796_566_024_200_000_000),
                    dumpb({"workspace": "default", "entity": ent})))
    return out


def relay_tuples(stream: list[tuple[str, bytes]]) -> tuple[Any, list[tuple[Any, ...]]]:
    """The records table's codec and the stream's records as pgoutput's text tuples."""
    import json

    from wakeline.cdc.compose import ColumnSpec, TableCodec

    cols = [("seq", 20), ("workspace", 25), ("entity", 25), ("collection", 25),
            ("collection_version", 23), ("type", 25), ("status", 25), ("key", 25),
            ("content", 3802), ("text", 25), ("tombstone", 16), ("parents", 1016),
            ("annotations", 3802), ("scores", 3802), ("enriched_at", 1184),
            ("created_at", 1184), ("produced_by_run", 20)]
    codec_ = TableCodec("public", "records", [ColumnSpec(n, t, key=n in ("workspace", "entity"))
                                              for n, t in cols])
    out = []
    for i, (ent, raw) in enumerate(stream):
        r = json.loads(raw)
        ts = f"2026-12-07 01:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 10**6:06d}+00"
        out.append((str(r["seq"]), "default", ent, r["collection"], "1", r.get("type", ""),
                    "active", r.get("key"), json.dumps(r["content"]), "", "f", "{}", "{}",
                    json.dumps(r.get("scores", {})), ts, ts, None))
    return codec_, out


def relay_compose(codec_: Any, tuples: list[tuple[Any, ...]]) -> list[tuple[bytes, bytes]]:
    """What the relay writes for each tuple as a ready insert: (key, envelope)."""
    template = SourceTemplate(db="wakeline")
    out = []
    for i, t in enumerate(tuples):
        src = template.block(schema="public", table="records", ts_us=1_796_566_024_123_456 + i,
                             tx_id=700 + i, lsn=0x16B3_0000 + 200 * i,
                             prev_commit_lsn=0x16B3_0000 + 200 * i - 200, snapshot=None)
        after = codec_.row(t)
        out.append((codec_.key(after), compose_envelope("c", None, after, src,
                                                        1_796_566_024_200_000_000)))
    return out


def specification_compose(codec_: Any, tuples: list[tuple[Any, ...]]
                          ) -> list[tuple[bytes, bytes]]:
    """:func:`relay_compose` by the specification: the ``json`` encoder, timestamps parsed."""
    from wakeline.cdc import compose, values

    saved = compose.dumpb, values.zoned_timestamp
    compose.dumpb = lambda v: dumps(v).encode("utf-8")
    values.zoned_timestamp = values.zoned
    try:
        return relay_compose(codec_, tuples)
    finally:
        compose.dumpb, values.zoned_timestamp = saved


def python_parse(message: tuple[bytes, bytes]) -> Any:
    """envelope.parse with its C parser off."""
    saved, envelope._c_parse = envelope._c_parse, None
    try:
        return envelope.parse(*message)
    finally:
        envelope._c_parse = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.entities, a.repeat = 300, 1
    if codec._c_encode_body is None or codec._c_decode_body is None or \
            ready._c_items is None or envelope._c_parse is None:
        sys.exit("the C side is not built (or WAKELINE_PURE_CODEC is set): nothing to compare")
    stream = workload(a.entities, a.entities * 4)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, held = run_core(stream, write_catalog(Path(tmp)))
    batches, changes = ready_batches(stream)
    if any(ready.decode(b)[1] != python_ready(b) for b in batches):
        sys.exit("the C and Python ready-batch decoders disagree")
    messages = envelopes(stream)
    if any(envelope.parse(*m) != python_parse(m) for m in messages):
        sys.exit("the C and Python envelope parsers disagree")
    taken = sum(envelope._c_parse(loads(v), k) is not None for v, k in messages)
    if taken != len(messages):
        sys.exit(f"the C parser left {len(messages) - taken} relay envelopes to Python")
    rcodec, tuples = relay_tuples(stream)
    if relay_compose(rcodec, tuples) != specification_compose(rcodec, tuples):
        sys.exit("the relay's compose and its specification write different bytes")
    states = list(held.values())
    blobs = [codec.encode_state(s) for s in states]
    mismatched = sum(b != python_encode(s) for s, b in zip(states, blobs, strict=True))
    if mismatched:
        sys.exit(f"{mismatched} states encode differently in C and in Python")
    keys = [(b, s.workspace, s.entity) for s, b in zip(states, blobs, strict=True)]
    if any(codec.decode_state(*k) != python_decode(k) for k in keys):
        sys.exit("the C and Python readers disagree")
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000)  # a collection per 50,000 allocations, as a worker between batches
    us = 1e6
    c_enc = timed(codec.encode_state, states, a.repeat) * us
    py_enc = timed(python_encode, states, a.repeat) * us
    c_dec = timed(lambda k: codec.decode_state(*k), keys, a.repeat) * us
    py_dec = timed(python_decode, keys, a.repeat) * us
    per_change = len(batches) / changes * us
    c_ready = timed(ready.decode, batches, a.repeat) * per_change
    py_ready = timed(python_ready, batches, a.repeat) * per_change
    handed = timed_handoff(batches, a.repeat) * per_change
    decoded = timed_kept(ready.decode, batches, a.repeat) * per_change
    c_parse = timed(lambda m: envelope.parse(*m), messages, a.repeat) * us
    py_parse = timed(python_parse, messages, a.repeat) * us
    per_tuple = us / len(tuples)
    composed = timed(lambda ts: relay_compose(rcodec, ts), [tuples], a.repeat) * per_tuple
    composed_spec = timed(lambda ts: specification_compose(rcodec, ts), [tuples],
                          a.repeat) * per_tuple
    size = sum(map(len, blobs)) / len(blobs)
    print(f"states                 {len(states):,} (core workload over {a.entities:,} entities, "
          f"{size:.0f} B stored on average, all equal in C and Python)")
    print(f"encode_state, C writer  {c_enc:6.2f} us/state")
    print(f"decode_state, C reader  {c_dec:6.2f} us/state")
    print(f"reference: the Python writer {py_enc:6.2f} us/state, the Python reader "
          f"{py_dec:6.2f} us/state")
    print(f"ready.decode, C items   {c_ready:6.2f} us/change  ({changes:,} changes in batches "
          f"of 1,000; the Python decoder {py_ready:.2f} us/change)")
    print(f"ready.decode, handed over {handed:6.2f} us/change, results kept  (the same "
          f"batches kept in a ready.Handoff by their bytes, as a one-process worker's "
          f"readiness stage keeps them; decoding them with results kept {decoded:.2f} "
          f"us/change, ratio {handed / decoded:.3f})")
    print(f"envelope.parse, C       {c_parse:6.2f} us/envelope  ({len(messages):,} relay "
          f"envelopes of ready inserts; the Python parser {py_parse:.2f} us/envelope)")
    print(f"relay compose           {composed:6.2f} us/change  (row, key and envelope of "
          f"{len(tuples):,} records tuples; the specification {composed_spec:.2f} us/change, "
          f"ratio {composed / composed_spec:.3f})")
    print(f"ratio C / Python: encode {c_enc / py_enc:.3f}, decode {c_dec / py_dec:.3f}, "
          f"ready batch {c_ready / py_ready:.3f}, envelope {c_parse / py_parse:.3f}")


if __name__ == "__main__":
    main()
