"""Every benchmark runs once at a tiny size so it cannot rot (figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")
                 and p.name not in {"cdc_latency.py"})  # needs services: tested in integration


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_runs_tiny_and_prints_a_ratio(script: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / script), "--tiny"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ratio" in proc.stdout.splitlines()[-1]
