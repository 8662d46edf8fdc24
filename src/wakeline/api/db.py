"""A small pool of autocommit psycopg connections for the API's worker threads.

FastAPI runs the (synchronous) endpoints in a thread pool; each borrows one
connection for the request and gives it back.  A connection that failed is
closed instead of returned, so the next borrower gets a fresh one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg


class Pool:
    def __init__(self, dsn: str, *, size: int = 8, timeout: float = 10.0) -> None:
        self.dsn = dsn
        self.size = size
        self.timeout = timeout
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if not self._slots.acquire(timeout=self.timeout):
            raise psycopg.OperationalError("no database connection free in time")
        conn: psycopg.Connection[Any] | None = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            if conn.closed:
                conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            yield conn
        except psycopg.Error:
            if conn is not None:
                conn.close()
            conn = None
            raise
        finally:
            if conn is not None:
                if conn.closed or self._closed or conn.info.transaction_status != \
                        psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
