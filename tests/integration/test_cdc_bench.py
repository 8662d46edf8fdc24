"""bench/cdc_latency.py runs (tiny) on the session's services, so it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cdc_latency.py"


def test_cdc_latency_bench_runs_tiny(pg_server: Any, kafka_broker: Any,
                                     kafka_connect: Any) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--no-concurrent", "--pg-dsn", pg_server.dsn,
         "--bootstrap", kafka_broker.bootstrap, "--connect-url", kafka_connect.rest_url],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "ratio" in lines[-1]
    assert sum("arrived" in line for line in lines) == 2
