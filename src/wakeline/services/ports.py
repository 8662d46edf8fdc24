"""Free TCP port selection on the loopback interface.

The kernel picks an unused ephemeral port; we release it and hand the number to
the service. Another process could take it in between: the window is small and a
service that then fails to bind reports it in its log and readiness error.
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct free TCP ports on ``host``.

    All sockets stay open until every port is chosen, so the numbers are distinct
    (a broker needs a client port and a controller port).
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port(host: str = LOOPBACK) -> int:
    """Return one free TCP port on ``host``."""
    return free_ports(1, host)[0]


def port_is_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
