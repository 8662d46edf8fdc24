"""The demo feeder of ``wakeline up``: an agent-memory workload for the example catalog.

Three users chat in bursts (every message arrives unready; the readiness agent
runs the catalog's enrichers and marks it ready), state profile facts, repeat a
fact (a byte-identical rewrite that must not fire ``skills``), contradict
themselves, put events in their calendar an hour and a few seconds ahead (so
the ``at`` reminder fires while you watch) and withdraw a fact.  Deterministic
for a given seed; writes through the store like an application would.
"""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from wakeline.catalog import Catalog
from wakeline.store import Store
from wakeline.store.records import NoLiveHead

USERS = ("user:mia", "user:noah", "user:ava")
LINES = ("Morning! Planning the week.", "Can you remind me about the design review?",
         "I moved to the platform team.", "Feeling a bit stressed about the launch.",
         "The launch went well, thanks!", "Let's catch up on Friday.")


class DemoFeeder:
    def __init__(self, dsn: str, catalog: Catalog, *, seed: int = 1, pace: float = 0.6) -> None:
        self.dsn = dsn
        self.catalog = catalog
        self.rnd = random.Random(seed)
        self.pace = pace
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-feeder", daemon=True)
        self._main_version = catalog.collections["main"].active_version

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # a worker that failed to start never started it
            self._thread.join(10)

    def _sleep(self, seconds: float) -> bool:
        return not self._stop.wait(seconds)

    def _chat(self, store: Store, user: str, text: str, *, kind: str = "chat",
              extra: dict[str, Any] | None = None) -> int:
        """Insert unready, as an application does: the readiness agent runs the
        catalog's enrichers (importance, sentiment_v1) and marks it ready."""
        seq = store.insert_record(
            workspace="default", entity=user, collection="main",
            collection_version=self._main_version, type=kind,
            content={"session_id": f"{user}:s1", "speaker": "user", **(extra or {})},
            text=text, ready=False)
        self.written += 1
        return seq

    def _run(self) -> None:
        store = Store.connect(self.dsn)
        try:
            self._script(store)
        finally:
            store.close()

    def _script(self, store: Store) -> None:
        now = datetime.now(UTC)
        for i, user in enumerate(USERS):
            starts = now + timedelta(hours=1, seconds=20 + 10 * i)
            store.insert_record(workspace="default", entity=user, collection="calendar_events",
                                key="design-review", ready=True,
                                content={"title": "Design review",
                                         "starts_at": starts.isoformat().replace("+00:00", "Z"),
                                         "attendees": ["mia", "noah"]})
            self.written += 1
        for round_no in range(1_000_000):
            for user in USERS:
                for _ in range(self.rnd.randint(1, 3)):
                    self._chat(store, user, self.rnd.choice(LINES))
                    if not self._sleep(self.pace):
                        return
            user = USERS[round_no % len(USERS)]
            role = ("engineer", "manager", "engineer", "researcher")[round_no % 4]
            self._chat(store, user, f"I'm now a {role}.", kind="observation",
                       extra={"facts": {"role": role}, "tags": ["claim"],
                              "claim": {"key": "role", "value": role}})
            if round_no % 3 == 2:
                self._chat(store, user, "Actually, not sure about my role.", kind="observation",
                           extra={"forget": ["role"], "tags": ["claim"],
                                  "claim": {"key": "role", "value": "unknown"}})
            if round_no % 5 == 4:
                try:
                    store.retract("default", user, "profiles", "commitments")
                    self.written += 1
                except NoLiveHead:
                    pass
            if not self._sleep(self.pace * 3):
                return
