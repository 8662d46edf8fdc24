"""The readiness stage stamps each ready batch with its newest change's COMMIT time
(``source.ts_us``), not the time the change reached the broker.

The conditions agent holds a partition's evaluation time back by how long ago that
stamp is (``streams.app.event_times``).  With the broker's time, a CDC path that
lags (the relay in a busy worker) hid its lag: a debounce deadline (arrival + 1 s)
had passed by the time the change was produced, and a burst ran entities twice
(bench/burst.py: 1,128 runs for 1,000 entities; with the commit time, 1,000)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tests.unit.cdc import samples
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.catalog import compile_catalog
from wakeline.streams import ready
from wakeline.streams.readiness import Enricher, ReadinessConsumer


class _Msg:
    """A consumed change message as confluent-kafka hands it over."""

    def __init__(self, m: dict[str, Any], broker_ms: int) -> None:
        self._m, self._ts = m, broker_ms

    def key(self) -> bytes:
        return self._m["key"].encode()

    def value(self) -> bytes:
        return self._m["value"].encode()

    def partition(self) -> int:
        return self._m["partition"]

    def offset(self) -> int:
        return self._m["offset"]

    def topic(self) -> str:
        return "changes"

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts


class _NoDeadLetters:
    def write_error(self, exc: Exception, msg: Any) -> None:
        raise AssertionError(f"dead-lettered: {exc}")


def _consumer(tmp_path: Path) -> ReadinessConsumer:
    cat = compile_catalog(catalog_dir(tmp_path, {"w": derivation("w", "write: {}")}))
    return ReadinessConsumer(Enricher(cat, None), bootstrap="unused", topic="changes",  # type: ignore[arg-type]
                             ready_topic="ready", dead_letter_topic="dlq", group="g",
                             stop=threading.Event(), on_outcome=lambda o: None)


def test_commits_track_each_partitions_newest_commit_time(tmp_path: Path) -> None:
    rc = _consumer(tmp_path)
    commits: dict[int, int] = {}
    want: dict[int, int] = {}
    handled = 0
    for m in samples.messages():
        v = json.loads(m["value"]) if m["value"] else None
        if v is None or v["op"] == "r":
            continue  # snapshot reads: stamped with the snapshot's start
        item = rc.handle(_Msg(m, broker_ms=v["source"]["ts_ms"] + 60_000), _NoDeadLetters(),
                         commits)
        if item is not None:
            handled += 1
        want[m["partition"]] = max(want.get(m["partition"], 0), v["source"]["ts_us"] // 1000)
    assert handled >= 5
    # the commit time, not the (a minute later) broker time of the message
    assert commits == want


def test_a_ready_batch_carries_the_commit_time_in_seconds(tmp_path: Path) -> None:
    rc = _consumer(tmp_path)
    m = samples.find("c", "records")
    v = json.loads(m["value"])
    commits: dict[int, int] = {}
    item = rc.handle(_Msg(m, broker_ms=v["source"]["ts_ms"] + 5_000), _NoDeadLetters(), commits)
    assert item is not None
    p = m["partition"]
    _, items, t = ready.decode(ready.encode(p, [item], commits.get(p)))
    assert len(items) == 1
    assert t == v["source"]["ts_us"] // 1000 / 1000.0
