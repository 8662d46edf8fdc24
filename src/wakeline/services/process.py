"""A child process in its own process group: spawn, liveness, stop with kill fallback.

A :class:`ProcessHandle` is either live (we spawned it and hold the ``Popen``) or
adopted from a saved record (``wakeline services down`` in a later CLI run). Both
stop the same way: the service's stop signal to the leader, then SIGKILL to the
whole group, then SIGKILL to whatever is left of the group and of the leader's
descendants as they were when the stop began (a grandchild that outlived its
parent keeps the group id; PostgreSQL backends leave the group with setsid()).

Pids are reused by the kernel, so a record also stores the process start time
(``/proc/<pid>/stat`` field 22): an adopted handle whose pid now belongs to a
different process reports dead and is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wakeline.errors import ServiceError

_KILL_WAIT = 5.0


@dataclass(frozen=True)
class RunAs:
    """An unprivileged account to run a child as (only possible when we are root)."""

    uid: int
    gid: int
    name: str


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` from field 3 (state) on, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def pid_alive(pid: int, ticks: int | None = None) -> bool:
    """True when ``pid`` runs and is not a zombie (and started at ``ticks`` if given)."""
    fields = _stat_fields(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no procfs (not Linux): the weaker signal-0 probe
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def group_members(pgid: int) -> list[int]:
    """Pids of live processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live descendant of ``pid``.

    Needed besides the group: PostgreSQL's backends call setsid() and so leave
    the postmaster's process group.
    """
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[19])))
    found: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _demote(run_as: RunAs) -> dict[str, Any]:
    # Popen's own user/group/extra_groups switch identity after fork, before exec,
    # so the pid we record is the service itself (runuser would add a parent).
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


@dataclass
class ProcessHandle:
    """One spawned process that leads its own process group (``pgid == pid``)."""

    pid: int
    ticks: int | None
    argv: tuple[str, ...] = ()
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        run_as: RunAs | None = None,
    ) -> ProcessHandle:
        """Start ``argv`` in a new session, stdout and stderr appended to ``log_path``.

        The new session detaches it from our terminal and signals, so it survives
        the caller exiting (the CLI relies on that) and can be stopped as a group.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            log.write(f"=== wakeline {stamp} start: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=dict(env) if env is not None else None,
                    start_new_session=True,
                    close_fds=True,
                    **(_demote(run_as) if run_as else {}),
                )
            except OSError as exc:
                raise ServiceError(f"cannot start {argv[0]}: {exc}", argv=list(argv)) from exc
        return cls(pid=popen.pid, ticks=start_ticks(popen.pid), argv=tuple(argv), popen=popen)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ProcessHandle:
        """Adopt a process from :meth:`to_record` output (no ``Popen``)."""
        ticks = record.get("start_ticks")
        return cls(pid=int(record["pid"]), ticks=int(ticks) if ticks is not None else None)

    def to_record(self) -> dict[str, Any]:
        """JSON-able identity of the process: pid and start time."""
        return {"pid": self.pid, "start_ticks": self.ticks}

    def alive(self) -> bool:
        """True while the process runs (a reused pid counts as dead)."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid, self.ticks)

    def returncode(self) -> int | None:
        """The exit status when we spawned it and it has exited, else None."""
        return self.popen.poll() if self.popen is not None else None

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen is not None:
                try:
                    self.popen.wait(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
                    return True
                except subprocess.TimeoutExpired:
                    pass
            elif not self.alive():
                return True
            else:
                time.sleep(0.05)
            if time.monotonic() >= deadline:
                return not self.alive()

    def _group_is_ours(self) -> bool:
        # The kernel never hands out a pid that is still some group's id, so while
        # members of group ``pid`` remain, that group can only be the one we
        # started, unless the pid itself now runs a different program.
        if self.popen is not None:
            return True
        ticks = start_ticks(self.pid)
        return ticks is None or ticks == self.ticks

    def _kill_leftovers(self, family: list[tuple[int, int]]) -> list[int]:
        """SIGKILL what is left of the group and of ``family``; return survivors."""
        left = [(p, t) for p, t in family if pid_alive(p, t)]
        if self._group_is_ours():
            left += [(p, start_ticks(p) or 0) for p in group_members(self.pid)]
        # Children usually exit by themselves right after their parent (PostgreSQL
        # backends watch the postmaster): give them a moment before killing.
        deadline = time.monotonic() + 0.5
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [(p, t) for p, t in left if pid_alive(p, t)]
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _KILL_WAIT
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [(p, t) for p, t in left if pid_alive(p, t)]
        return [p for p, _ in left]

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Stop the process, its process group and its descendants. Idempotent.

        Sends ``sig`` to the leader and waits ``timeout`` seconds for a clean exit,
        then SIGKILLs the group. Blocks until nothing of the group is left.

        :raises ServiceError: if some member survives SIGKILL (should not happen).
        """
        family = descendants(self.pid) if self.alive() else []
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            if not self._wait_gone(timeout):
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._wait_gone(_KILL_WAIT)
        elif self.popen is not None:
            self.popen.wait(timeout=_KILL_WAIT)  # reap it
        survivors = self._kill_leftovers(family)
        if survivors or self.alive():
            raise ServiceError(
                f"process group {self.pid} did not stop: pids {survivors or [self.pid]} remain",
                pid=self.pid,
            )
