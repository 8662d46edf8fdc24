"""The contract every service honours, and the base class of managed ones.

:class:`Service` is what callers (fixtures, the CLI) depend on. Two shapes
implement it:

- :class:`ProcessService` owns a child process: ``start`` spawns it (in its own
  process group, logging to ``log_path``), ``wait_ready`` polls a real protocol
  probe, ``stop`` ends the whole group.
- External services (an existing DSN or bootstrap list) own nothing: ``start``
  and ``stop`` do nothing, readiness is the same probe.
"""

from __future__ import annotations

import shutil
import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from wakeline.errors import ServiceError, ServiceTimeout
from wakeline.services.paths import services_dir
from wakeline.services.process import ProcessHandle, RunAs

DEFAULT_TIMEOUT = 60.0


@runtime_checkable
class Service(Protocol):
    """A service Wakeline talks to.

    Contract: ``start`` returns once the process is spawned (it does not wait for
    readiness) and is idempotent; ``wait_ready`` blocks up to ``timeout`` seconds
    and raises :class:`ServiceTimeout`, or :class:`ServiceError` if the process
    died; ``is_ready`` is one quick probe that never raises; ``stop`` blocks until
    everything the service started is gone and is idempotent.
    """

    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    def wait_ready(self, timeout: float = DEFAULT_TIMEOUT) -> None: ...

    def is_ready(self) -> bool: ...

    def is_alive(self) -> bool: ...

    def stop(self, timeout: float = 15.0) -> None: ...

    def record(self) -> dict[str, Any]: ...


def log_tail(path: Path | None, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 16384))
        text = fh.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def poll_until_ready(
    service: Service, timeout: float, log_path: Path | None = None, *, what: str | None = None
) -> None:
    """Poll ``service.is_ready()`` with backoff.

    With a ``log_path`` the service is a process of ours: fail fast when it dies,
    and quote its log. ``what`` names the service in messages (default its name).
    """
    label = what or service.name
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if service.is_ready():
            return
        if log_path is not None and not service.is_alive():
            tail = log_tail(log_path)
            raise ServiceError(
                f"{label} exited before becoming ready"
                + (f"; log {log_path}:\n{tail}" if log_path else ""),
                service=service.name,
                log=str(log_path) if log_path else None,
            )
        if time.monotonic() >= deadline:
            tail = log_tail(log_path)
            raise ServiceTimeout(
                f"{label} not ready after {timeout:g}s"
                + (f"; log {log_path}:\n{tail}" if log_path else ""),
                service=service.name,
                log=str(log_path) if log_path else None,
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


class ProcessService(ABC):
    """A service that Wakeline runs as a child process.

    Subclasses set ``name`` and ``stop_signal``, and implement :meth:`_prepare`
    (write config, create folders, return the command line) and :meth:`is_ready`.

    Owns ``base_dir`` (config, data, log). With ``ephemeral=True`` the folder is
    deleted by :meth:`stop`; otherwise data persists across restarts.
    """

    name: ClassVar[str] = "service"
    #: Signal for a clean shutdown; the group is SIGKILLed after the stop timeout.
    stop_signal: ClassVar[int] = signal.SIGTERM

    def __init__(
        self,
        *,
        base_dir: Path | None = None,
        log_path: Path | None = None,
        ephemeral: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir or services_dir() / self.name).resolve()
        self.log_path = Path(log_path or self.base_dir / f"{self.name}.log").resolve()
        self.ephemeral = ephemeral
        self.process: ProcessHandle | None = None
        #: Seconds from :meth:`start` until ready, set by :meth:`up`.
        self.startup_seconds: float | None = None

    @abstractmethod
    def _prepare(self) -> list[str]:
        """Create folders and config; return the command line. Raise on missing tools."""

    def _env(self) -> dict[str, str] | None:
        """Environment of the child (None: inherit ours)."""
        return None

    def _run_as(self) -> RunAs | None:
        """The account to run the child as (None: our own)."""
        return None

    @abstractmethod
    def is_ready(self) -> bool:
        """One protocol-level readiness probe; never raises."""

    @property
    def pid(self) -> int | None:
        """Pid of the running process (None before start)."""
        return self.process.pid if self.process else None

    def is_alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.alive()

    def start(self) -> None:
        """Spawn the process (idempotent while it runs). Does not wait for readiness."""
        if self.is_alive():
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        argv = self._prepare()
        self.process = ProcessHandle.spawn(
            argv, log_path=self.log_path, cwd=self.base_dir, env=self._env(),
            run_as=self._run_as(),
        )

    def wait_ready(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until :meth:`is_ready`; see :class:`Service` for the errors."""
        if self.process is None:
            raise ServiceError(f"{self.name} was not started", service=self.name)
        poll_until_ready(self, timeout, self.log_path)

    def up(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """Start and wait until ready; on failure stop what was started and re-raise."""
        began = time.monotonic()
        try:
            self.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the process group (signal, then kill); delete ``base_dir`` if ephemeral."""
        if self.process is not None:
            self.process.stop(sig=self.stop_signal, timeout=timeout)
        if self.ephemeral:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def record(self) -> dict[str, Any]:
        """JSON-able description for the CLI state file."""
        rec: dict[str, Any] = {
            "service": self.name,
            "managed": True,
            "log": str(self.log_path),
            "base_dir": str(self.base_dir),
            "stop_signal": int(self.stop_signal),
        }
        if self.process is not None:
            rec.update(self.process.to_record())
        return rec

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ExternalService(ABC):
    """A service someone else runs: Wakeline only probes it."""

    name: ClassVar[str] = "external"
    pid: None = None
    log_path: None = None
    startup_seconds: float | None = None

    @abstractmethod
    def is_ready(self) -> bool:
        """One readiness probe; never raises."""

    @property
    @abstractmethod
    def address(self) -> str:
        """Where the service is reached (DSN, bootstrap servers)."""

    def is_alive(self) -> bool:
        """Unknown for a foreign process: report its readiness instead."""
        return self.is_ready()

    def start(self) -> None:  # noqa: B027 - deliberately a no-op
        """Nothing to start."""

    def wait_ready(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Block until reachable; :class:`ServiceTimeout` otherwise."""
        poll_until_ready(self, timeout, what=f"{self.name} at {self.address}")

    def up(self, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """Wait until reachable."""
        began = time.monotonic()
        self.wait_ready(timeout)
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self, timeout: float = 15.0) -> None:  # noqa: B027 - deliberately a no-op
        """Nothing to stop: the service is not ours."""

    def record(self) -> dict[str, Any]:
        return {"service": self.name, "managed": False}

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.stop()
