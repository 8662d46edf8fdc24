"""An independent reference evaluator of trigger conditions, answering from PostgreSQL.

:mod:`tests.oracle.sql` evaluates every data/time condition of a normalized catalog
from the ``records`` and ``derivation_cursors`` tables alone, written from seed 000
and ``docs/semantics.md`` without looking at the condition core.
:mod:`tests.oracle.mirror` copies a :class:`wakeline.testing.Simulator`'s state into
those tables so the differential tests can compare the two.
"""

from tests.oracle.mirror import mirror
from tests.oracle.sql import evaluate, evaluate_all, install

__all__ = ["evaluate", "evaluate_all", "install", "mirror"]
