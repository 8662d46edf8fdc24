"""The README's quickstart: exactly two commands, and the main job really runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quickstart has a sh code block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_test_one() -> None:
    cmds = quickstart_commands()
    assert cmds == ["make up", "make test"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test"]


def test_make_up_runs_the_main_job_on_the_embedded_default() -> None:
    # PostgreSQL runs as an unprivileged user when we are root: its data folder
    # must be reachable, which pytest's 0700 tmp folders are not.
    tmp_path = Path(tempfile.mkdtemp(prefix="wakeline-up-"))
    tmp_path.chmod(0o755)
    env = {**os.environ, "WAKELINE_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["make", "-s", "up", "UP_ARGS=--duration 30"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "schema v" in out and "Tansu" in out and "ready: relay, conditions" in out
    for trigger in ("profile.default", "profile.nightly", "reflection.default",
                    "session_summary.default", "reminders.default", "skills.default"):
        assert trigger in out
    runs = [line for line in out.splitlines() if "  run   " in line]
    assert any("reasons trigger:profile.bootstrap:lifecycle" in r for r in runs), out
    assert any("reasons trigger:reflection.default:threshold" in r for r in runs), out
    assert any("reasons trigger:reminders.default:at" in r for r in runs), out
    assert "stopped; run `make up` again to resume" in out
    # running it again resumes: the bootstrap never runs twice for an entity
    again = subprocess.run(["make", "-s", "up", "UP_ARGS=--duration 12 --no-feeder"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "profile.bootstrap:lifecycle" not in again.stdout, again.stdout
    # every service it started is gone again
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "home")], capture_output=True,
                               text=True)
    assert leftovers.stdout.strip() == ""
    shutil.rmtree(tmp_path, ignore_errors=True)
