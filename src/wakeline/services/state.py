"""The state file of services started by ``wakeline services up``.

``<WAKELINE_HOME>/services/state.json`` maps a role (``"postgres"``,
``"broker"``) to the service's :meth:`~wakeline.services.base.Service.record`:
endpoint (``dsn`` or ``bootstrap``), ``kind``, and for managed processes ``pid``,
``start_ticks`` (guards against pid reuse), ``log`` and ``stop_signal``. Other
commands read it to find the running stack::

    from wakeline.services import state
    dsn = state.load().get("postgres", {}).get("dsn")

``ports.json`` beside it remembers the last ports, so a restarted stack keeps
its DSN and bootstrap address when those ports are still free.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wakeline.services import kafka, postgres
from wakeline.services.paths import services_dir
from wakeline.services.ports import LOOPBACK
from wakeline.services.process import ProcessHandle

Record = dict[str, Any]


def state_file() -> Path:
    """Path of the state file (it may not exist)."""
    return services_dir() / "state.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    # Write-then-rename: a reader never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def load() -> dict[str, Record]:
    """Role → record of the services started by the CLI ({} when none)."""
    return _read(state_file())


def save(records: dict[str, Record]) -> None:
    """Replace the state file (deleted when ``records`` is empty)."""
    if records:
        _write(state_file(), records)
    else:
        state_file().unlink(missing_ok=True)


@contextmanager
def locked() -> Iterator[None]:
    """Hold the services lock: concurrent ``up``/``down`` runs take turns."""
    path = services_dir() / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def last_ports() -> dict[str, int]:
    """Role → the port it last listened on."""
    return {k: int(v) for k, v in _read(services_dir() / "ports.json").items()}


def remember_port(role: str, port: int) -> None:
    """Record ``port`` as the last port of ``role``."""
    path = services_dir() / "ports.json"
    _write(path, {**_read(path), role: port})


def port_if_free(port: int | None) -> int | None:
    """``port`` when nothing listens on it (or could bind it), else None."""
    if not port:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return None
    return port


def is_alive(record: Record) -> bool | None:
    """Whether a managed record's process runs; None for external services."""
    if not record.get("managed") or "pid" not in record:
        return None
    return ProcessHandle.from_record(record).alive()


def is_ready(record: Record) -> bool:
    """One protocol probe of the record's endpoint."""
    if "rest_url" in record:  # Kafka Connect: its REST root answers when it is up
        import urllib.request

        try:
            with urllib.request.urlopen(str(record["rest_url"]), timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False
    if "dsn" in record:
        return postgres.probe(str(record["dsn"]))
    if "bootstrap" in record:
        return kafka.probe(str(record["bootstrap"]))
    return False


def stop(record: Record, timeout: float = 15.0) -> None:
    """Stop a managed record's process group (nothing for external services)."""
    if record.get("managed") and "pid" in record:
        sig = int(record.get("stop_signal", signal.SIGTERM))
        ProcessHandle.from_record(record).stop(sig=sig, timeout=timeout)
