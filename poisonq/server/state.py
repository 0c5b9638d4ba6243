"""What every route shares: the broker, the auth, and the bulk tasks this process starts."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import Request

from poisonq.client import Broker, TaskRecord
from poisonq.errors import TaskRunningError
from poisonq.names import parse_address
from poisonq.server.auth import Auth
from poisonq.tasks import BulkTask

SHUTDOWN_WAIT = 10.0  # seconds to let a cancelled task finish its chunk at shutdown
API_CLIENT = "a client of the API"  # who started a task, for the API, which knows only the token


class _Starting:
    """Holds a queue while its task is being created (before it has an id)."""


_STARTING = _Starting()


class ServerState:
    """The server's broker and auth, and the resubmit and purge tasks it runs.

    A task runs in a thread of this process; its progress, who started it and who cancelled
    it are in the store, so any process can list, read and cancel it. The server keeps the
    tasks it started only to hold a queue while one is being created (two requests at once,
    a confirmation page brought back by the Back button) and to cancel the running ones when
    it shuts down, so no task is left marked ``running`` with nobody running it.
    """

    def __init__(self, broker: Broker, auth: Auth, owns_broker: bool) -> None:
        self.broker = broker
        self.auth = auth
        self._owns_broker = owns_broker
        self._by_queue: dict[str, _Starting] = {}  # queues whose task is being created
        self._tasks: list[BulkTask] = []  # started here, their threads not yet seen done
        self._lock = threading.Lock()

    def start_resubmit(
        self,
        queue: str,
        *,
        to: str | None,
        rate: float | None,
        where: dict[str, Any],
        operator: str | None = None,
    ) -> TaskRecord:
        """Start moving the matching dead-letters back, at most ``rate`` per second.
        Raises :class:`TaskRunningError` while a task works on ``queue``'s dead letters."""
        key = self._claim(queue)
        try:
            task = self.broker.resubmit(
                queue, to=to, rate=rate, wait=False, started_by=operator or API_CLIENT, **where
            )
        except BaseException:
            self._release(key)
            raise
        self._track(key, task)
        return task.record

    def start_purge(
        self, queue: str, where: dict[str, Any], operator: str | None = None
    ) -> TaskRecord:
        """Start dropping the matching dead-letters (chunk by chunk, each chunk one
        transaction). Raises :class:`TaskRunningError` as :meth:`start_resubmit`."""
        key = self._claim(queue)
        try:
            task = self.broker.purge(queue, wait=False, started_by=operator or API_CLIENT, **where)
        except BaseException:
            self._release(key)
            raise
        self._track(key, task)
        return task.record

    def cancel(self, task_id: int, operator: str | None = None) -> TaskRecord:
        """Cancel a task (any process's, by id); the store keeps who did."""
        return self.broker.cancel_task(task_id, by=operator or API_CLIENT)

    def running(self, queue: str) -> TaskRecord | None:
        """The task working on ``queue``'s dead letters, if any (whichever process runs it)."""
        return self.broker.running_task(queue)

    def close(self) -> None:
        with self._lock:
            tasks, self._tasks = self._tasks, []
        for task in tasks:
            if task.refresh().status == "running":
                task.cancel(by="the server, shutting down")
        for task in tasks:
            task.wait(SHUTDOWN_WAIT)  # its chunk in progress, before the broker closes
        if self._owns_broker:
            self.broker.close()

    def _claim(self, queue: str) -> str:
        """Hold ``queue`` while its new task is created, or raise :class:`TaskRunningError`
        if this server is creating one there. The store refuses a task beside a running one
        (any process's); this covers two requests at once in this server."""
        key = parse_address(queue).entity
        with self._lock:
            if key in self._by_queue:
                raise TaskRunningError(key, None)
            self._by_queue[key] = _STARTING
        return key

    def _track(self, key: str, task: BulkTask) -> None:
        with self._lock:
            self._by_queue.pop(key, None)
            self._tasks = [t for t in self._tasks if t.running] + [task]

    def _release(self, key: str) -> None:
        """A task failed to start: the queue is free again."""
        with self._lock:
            self._by_queue.pop(key, None)


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.poisonq
    return state
