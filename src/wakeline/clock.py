"""Injectable clocks.  Every time-based behaviour takes a :class:`Clock`.

``SystemClock`` reads the wall clock; ``ManualClock`` only moves when a test or
the simulator advances it, so no test sleeps through a condition's real duration.
All instants are timezone-aware UTC ``datetime`` objects.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of the current instant.  ``now()`` must not block and must be UTC-aware."""

    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | str) -> None:
        self._now = parse_instant(start)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("a clock never moves backwards")
        self._now += timedelta(seconds=seconds)
        return self._now

    def set(self, instant: datetime | str) -> datetime:
        target = parse_instant(instant)
        if target < self._now:
            raise ValueError("a clock never moves backwards")
        self._now = target
        return self._now


def parse_instant(value: datetime | str) -> datetime:
    """Parse an ISO-8601 instant; naive values are rejected rather than guessed."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"instant {value!r} has no timezone; use UTC, e.g. '...Z'")
    return value.astimezone(UTC)


def iso(value: datetime | None) -> str | None:
    """Render an instant as ISO-8601 with a trailing Z (the API's format)."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class FileClock:
    """A clock another process controls: ``now()`` is the instant written in a file.

    Tests inject it into worker subprocesses (``WAKELINE_CLOCK_FILE``) and into the
    API so one timeline spans every process without sleeping.  The file holds one
    ISO-8601 instant; :meth:`write` replaces it atomically.  Reading costs one small
    file read per call, which is fine for tests and demos, not for production.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def now(self) -> datetime:
        return parse_instant(self.path.read_text().strip())

    @staticmethod
    def write(path: str | os.PathLike[str], instant: datetime | str) -> None:
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(iso(parse_instant(instant)) or "")
        os.replace(tmp, target)

    def set(self, instant: datetime | str) -> datetime:
        new = parse_instant(instant)
        if new < self.now():
            raise ValueError("a clock never moves backwards")
        self.write(self.path, new)
        return new

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("a clock never moves backwards")
        return self.set(self.now() + timedelta(seconds=seconds))


#: The environment variable naming a :class:`FileClock` file.
CLOCK_ENV = "WAKELINE_CLOCK_FILE"


def clock_from_env() -> Clock:
    """``FileClock($WAKELINE_CLOCK_FILE)`` when set, else the system clock."""
    path = os.environ.get(CLOCK_ENV)
    return FileClock(path) if path else SystemClock()
