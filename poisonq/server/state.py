"""What every route shares: the broker, the auth, and the bulk tasks this process runs."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import Request

from poisonq.client import Broker
from poisonq.server.auth import Auth
from poisonq.store.base import TaskRecord
from poisonq.tasks import BulkTask

SHUTDOWN_WAIT = 10.0  # seconds to let a cancelled task finish its chunk at shutdown


class ServerState:
    """The server's broker and auth, and the resubmit tasks it started.

    A resubmit runs in a thread of this process; its progress is in the store, so any
    process can read it and cancel it by id. The server keeps the running ones only to
    cancel them when it shuts down, so no task is left marked ``running`` with nobody
    running it.
    """

    def __init__(self, broker: Broker, auth: Auth, owns_broker: bool) -> None:
        self.broker = broker
        self.auth = auth
        self._owns_broker = owns_broker
        self._running: dict[int, BulkTask] = {}
        self._lock = threading.Lock()

    def start_resubmit(
        self, queue: str, *, to: str | None, rate: float | None, where: dict[str, Any]
    ) -> TaskRecord:
        """Start moving the matching dead-letters back, at most ``rate`` per second."""
        task = self.broker.resubmit(queue, to=to, rate=rate, wait=False, **where)
        with self._lock:
            self._running = {i: t for i, t in self._running.items() if t.status == "running"}
            self._running[task.id] = task
        return task.record

    def purge(self, queue: str, where: dict[str, Any]) -> TaskRecord:
        """Drop the matching dead-letters (chunk by chunk, each chunk one transaction)."""
        return self.broker.purge(queue, **where).record

    def close(self) -> None:
        with self._lock:
            running = list(self._running.values())
            self._running.clear()
        for task in running:
            if task.status == "running":
                task.cancel()
            task.wait(SHUTDOWN_WAIT)
        if self._owns_broker:
            self.broker.close()


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.poisonq
    return state
