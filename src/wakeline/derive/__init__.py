"""Derive: run a derivation for one job and co-commit its effects in PostgreSQL."""

from wakeline.derive.errors import PermanentError, TransientError, classify
from wakeline.derive.executor import DeriveExecutor, JobSpec, RunResult

__all__ = ["DeriveExecutor", "JobSpec", "PermanentError", "RunResult", "TransientError",
           "classify"]
