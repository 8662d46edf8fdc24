"""The benchmarks' per-process CPU accounting (bench/_stack.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _stack import cpu_share  # noqa: E402


def test_a_process_renamed_inside_the_window_counts_only_its_window() -> None:
    before = {(10, "kworker/u4:2-events_unbound"): 500.0, (20, "java"): 40.0,
              (30, "python"): 7.0}
    after = {(10, "kworker/u4:2-flush"): 500.3, (20, "java"): 41.5, (30, "python"): 9.0,
             (40, "postgres"): 0.25}  # 40 started inside the window
    shares = cpu_share(before, after, {30: "worker"})
    assert {k: round(v, 6) for k, v in shares.items()} == {
        "kernel": 0.3, "java": 1.5, "worker": 2.0, "postgres": 0.25}
