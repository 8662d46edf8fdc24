"""Which worker runs Faust: only one with an agent role (conditions, cron)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from wakeline.streams.app import AGENT_ROLES, ROLES
from wakeline.streams.worker import run_worker


def test_the_agent_roles_are_the_roles_with_faust_agents() -> None:
    assert AGENT_ROLES == {"conditions", "cron"} and AGENT_ROLES <= set(ROLES)


def test_on_started_needs_a_role_that_runs_faust() -> None:
    # nothing is started: the check comes before the topics are created
    rt = SimpleNamespace(roles=("readiness", "derive"))
    with pytest.raises(ValueError, match="conditions or cron role"):
        run_worker(rt, on_started=lambda app: None)  # type: ignore[arg-type]
