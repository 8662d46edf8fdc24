"""Serve the API with uvicorn, in the foreground or in a background thread.

``ApiServer(ctx, host, port).start()`` runs uvicorn in a daemon thread (how
``wakeline up`` and the tests include it) and returns once it accepts
connections; ``stop()`` shuts it down.  ``port=0`` picks a free port.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from wakeline.api.app import create_app
from wakeline.api.context import ApiContext
from wakeline.errors import ServiceError


class ApiServer:
    def __init__(self, ctx: ApiContext, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.ctx = ctx
        self.host = host
        self.port = port or _free_port(host)
        self.app = create_app(ctx)
        config = uvicorn.Config(self.app, host=host, port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve(self) -> None:
        """Run in this thread until interrupted (``wakeline api``)."""
        self.ctx.view.start()  # tail the agents' changelog before the first dashboard call
        self.server.run()

    def start(self, timeout: float = 30.0) -> ApiServer:
        # uvicorn leaves signal handlers alone outside the main thread.
        self.ctx.view.start()
        self._thread = threading.Thread(target=self.server.run, name="api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServiceError(f"the API did not start on {self.url}", url=self.url)
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.ctx.close()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
