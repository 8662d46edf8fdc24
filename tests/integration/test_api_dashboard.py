"""The dashboard in headless Chromium (Debian's ``chromium``), on real brokers.

The test creates a consumer lag itself: a consumer group reads part of a topic,
commits, and is paused while more messages arrive.  On Apache Kafka the page must
show that exact lag; on Tansu (whose end offsets count batches) it must say the
lag is unreliable instead of showing a number.  Panels fail independently: no
conditions worker runs here, so the mailbox panel reports its error while the
others render.  Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pydantic import SecretStr

from tests.fixtures.streaming import ROOT, make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.api import ApiContext, ApiServer, ApiSettings
from wakeline.catalog import compile_catalog
from wakeline.cdc._kafka import ensure_topic
from wakeline.services.chromium import ensure_chromium
from wakeline.topology import load_topology

pytestmark = pytest.mark.integration

OPS = "ops-token-dash"
ARTIFACTS = Path(os.environ.get("WAKELINE_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture(scope="module")
def chromium() -> str:
    # Never a skip: `wakeline services fetch` installs it; a missing browser is an error.
    return ensure_chromium()


def _chromium(binary: str, url: str, *args: str, budget_ms: int = 8000) -> str:
    with tempfile.TemporaryDirectory(prefix="wl-chromium-") as profile:
        done = subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
             f"--virtual-time-budget={budget_ms}", *args, url],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _text(html: str) -> str:
    """The page's visible text, roughly (tags dropped, whitespace collapsed)."""
    html = re.sub(r"<script.*?</script>|<style.*?</style>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&amp;", "&")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


class Lagging:
    """A consumer group that read ``read`` of ``first`` messages, committed, and was
    paused; then ``more`` messages arrived.  Its lag is ``first - read + more``."""

    def __init__(self, bootstrap: str, first: int = 10, read: int = 4, more: int = 5) -> None:
        self.topic = f"lag-{uuid.uuid4().hex[:8]}"
        self.group = f"lag-group-{uuid.uuid4().hex[:8]}"
        ensure_topic(bootstrap, self.topic, 1)
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})

        def produce(n: int) -> None:
            # One flush per message: one record per batch, so even Tansu's end offset
            # would count right here — the page must still refuse to trust it.
            for i in range(n):
                producer.produce(self.topic, value=f"m{i}".encode(), partition=0)
                producer.flush(10)

        produce(first)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": self.group,
                                  "enable.auto.commit": False, "session.timeout.ms": 6000,
                                  "auto.offset.reset": "earliest", "log_level": 3})
        tp = TopicPartition(self.topic, 0, 0)
        self.consumer.assign([tp])
        got, deadline = 0, time.monotonic() + 30
        while got < read and time.monotonic() < deadline:
            m = self.consumer.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        assert got == read
        self.consumer.commit(offsets=[TopicPartition(self.topic, 0, read)], asynchronous=False)
        self.consumer.pause([TopicPartition(self.topic, 0)])
        produce(more)
        self.lag = first - read + more
        self.committed = read
        self.end = first + more

    def close(self) -> None:
        self.consumer.close()


def _dashboard(pg_server: Any, tmp: Path, bootstrap: str, groups: list[str]
               ) -> tuple[ApiServer, Any]:
    cat = catalog_dir(tmp, {"wr": derivation("wr", "write: {}",
                                             source="collections: [relations]")})
    st = make_stack(pg_server, tmp, bootstrap, cat)
    ctx = ApiContext(load_topology(st.topology), compile_catalog(st.catalog), st.dsn,
                     st.bootstrap, app_id=st.app_id,
                     settings=ApiSettings(tokens={"default": SecretStr("t-dash")},
                                          operator_token=SecretStr(OPS), consumer_groups=groups,
                                          dashboard_refresh_s=1.0))
    with st.store.conn.transaction():
        st.store.conn.execute(
            "INSERT INTO trigger_pauses (workspace, trigger, reason, until) "
            "VALUES ('default', 'wr.default', 'load test in progress', NULL)")
    return ApiServer(ctx, port=0).start(), st


@pytest.fixture
def kafka_dashboard(pg_server: Any, kafka_broker: Any, tmp_path: Path
                    ) -> Iterator[tuple[ApiServer, Lagging]]:
    lag = Lagging(kafka_broker.bootstrap)
    server, st = _dashboard(pg_server, tmp_path, kafka_broker.bootstrap, [])
    try:
        yield server, lag
    finally:
        server.stop()
        lag.close()
        st.store.close()


@pytest.fixture
def tansu_dashboard(pg_server: Any, tansu_broker: Any, tmp_path: Path
                    ) -> Iterator[tuple[ApiServer, Lagging]]:
    lag = Lagging(tansu_broker.bootstrap)
    # Tansu lists no consumer groups: the operator names the ones to show.
    server, st = _dashboard(pg_server, tmp_path, tansu_broker.bootstrap, [lag.group])
    try:
        yield server, lag
    finally:
        server.stop()
        lag.close()
        st.store.close()


def _wait_view_error(server: ApiServer) -> None:
    view = server.ctx.view
    deadline = time.monotonic() + 20
    while view.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert view.error is not None


def test_dashboard_shows_the_lag_a_paused_consumer_built_on_kafka(
        chromium: str, kafka_dashboard: tuple[ApiServer, Lagging]) -> None:
    server, lag = kafka_dashboard
    _wait_view_error(server)  # no conditions worker: the mailbox panel must fail alone
    data = httpx.get(server.url + "/dashboard/data",
                     headers={"Authorization": f"Bearer {OPS}"}, timeout=30).json()
    panel = data["panels"]["consumer_lag"]
    assert panel["ok"], panel
    rows = [r for r in panel["data"]["partitions"] if r["group"] == lag.group]
    assert rows == [{"group": lag.group, "topic": lag.topic, "partition": 0, "agent": "other",
                     "committed": lag.committed, "end": lag.end, "reported_end": lag.end,
                     "lag": lag.lag}]
    assert panel["data"]["reliable"] is True and panel["data"]["broker"] == "kafka"

    url = f"{server.url}/dashboard#token={OPS}"
    text = _text(_chromium(chromium, url, "--dump-dom"))
    assert f"Total lag: {lag.lag} messages" in text, text
    assert re.search(rf"group {lag.group}\s*: lag {lag.lag}\b", text), text
    row = rf"{lag.group} {lag.topic} 0 other {lag.committed} {lag.end} {lag.lag}"
    assert re.search(row, text), text
    # One failing panel never blanks the others.
    assert "panel unavailable: RuntimeError: no changelog topic" in text, text
    assert "Total replication lag:" in text and "Runs/s:" in text, text
    assert "wr.default" in text and "load test in progress" in text, text
    assert "unreliable" not in text
    refreshes = re.search(r'data-refreshes="(\d+)"', _chromium(chromium, url, "--dump-dom"))
    assert refreshes and int(refreshes.group(1)) >= 2, "the page polls its data"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard-kafka.png"
    shot.unlink(missing_ok=True)
    _chromium(chromium, url, f"--screenshot={shot}", "--window-size=1400,1400")
    assert shot.exists() and _png_size(shot) == (1400, 1400)
    assert shot.stat().st_size > 20_000


def test_dashboard_says_lag_is_unreliable_on_tansu(
        chromium: str, tansu_dashboard: tuple[ApiServer, Lagging]) -> None:
    server, lag = tansu_dashboard
    url = f"{server.url}/dashboard#token={OPS}"
    text = _text(_chromium(chromium, url, "--dump-dom"))
    assert "Lag unreliable on this broker (tansu)" in text, text
    assert "counts batches, not records" in text, text
    assert "Total lag:" not in text, text
    # The committed offset is shown; the lag and end columns say why they are absent.
    assert re.search(rf"{lag.group} {lag.topic} 0 other {lag.committed} unreliable unreliable",
                     text), text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard-tansu.png"
    shot.unlink(missing_ok=True)
    _chromium(chromium, url, f"--screenshot={shot}", "--window-size=1400,1400")
    assert shot.exists() and _png_size(shot) == (1400, 1400)


def test_dashboard_data_needs_the_operator_token(tansu_dashboard: tuple[ApiServer, Lagging]
                                                 ) -> None:
    server, _ = tansu_dashboard
    assert httpx.get(server.url + "/dashboard/data").status_code == 401
    assert httpx.get(server.url + "/dashboard/data",
                     headers={"Authorization": "Bearer t-dash"}).status_code == 401
    page = httpx.get(server.url + "/dashboard")
    assert page.status_code == 200 and "Consumer lag" in page.text
