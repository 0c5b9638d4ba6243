"""What every route shares: the broker, the auth, and the bulk tasks this process starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from poisonq.client import Broker, TaskRecord
from poisonq.errors import TaskRunningError
from poisonq.names import parse_address
from poisonq.server.auth import Auth
from poisonq.tasks import BulkTask

SHUTDOWN_WAIT = 10.0  # seconds to let a cancelled task finish its chunk at shutdown
KEPT_TASKS = 200  # the newest tasks this server started, listed on /ui/tasks


@dataclass(frozen=True, slots=True)
class StartedTask:
    """A task this server started: on which queue, and by whom (the name an operator gave
    at login; None for the API, which knows only the token)."""

    task: BulkTask
    queue: str
    operator: str | None


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A task cancelled through this server, and by whom (as :class:`StartedTask`)."""

    operator: str | None


class _Starting:
    """Holds a queue while its task is being created (before it has an id)."""


_STARTING = _Starting()


class ServerState:
    """The server's broker and auth, and the resubmit and purge tasks it started.

    A resubmit runs in a thread of this process; its progress is in the store, so any
    process can read it and cancel it by id. The server keeps the tasks it started: to list
    them (the broker lists no tasks), to refuse a second task on a queue while one runs
    there, and to cancel the running ones when it shuts down, so no task is left marked
    ``running`` with nobody running it.
    """

    def __init__(self, broker: Broker, auth: Auth, owns_broker: bool) -> None:
        self.broker = broker
        self.auth = auth
        self._owns_broker = owns_broker
        self._started: dict[int, StartedTask] = {}  # by id, oldest first
        self._by_queue: dict[str, BulkTask | _Starting] = {}  # each queue's latest task
        self._cancelled: dict[int, Cancellation] = {}  # by id, oldest first
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
        Raises :class:`TaskRunningError` while this server runs a task on ``queue``."""
        key = self._claim(queue)
        try:
            task = self.broker.resubmit(queue, to=to, rate=rate, wait=False, **where)
        except BaseException:
            self._release(key)
            raise
        self._track(key, task, operator)
        return task.record

    def start_purge(
        self, queue: str, where: dict[str, Any], operator: str | None = None
    ) -> TaskRecord:
        """Start dropping the matching dead-letters (chunk by chunk, each chunk one
        transaction). Raises :class:`TaskRunningError` while this server runs a task on
        ``queue``."""
        key = self._claim(queue)
        try:
            task = self.broker.purge(queue, wait=False, **where)
        except BaseException:
            self._release(key)
            raise
        self._track(key, task, operator)
        return task.record

    def cancel(self, task_id: int, operator: str | None = None) -> TaskRecord:
        """Cancel a task (any process's, by id) and remember who did, if it was running:
        the store records no operator, so this server keeps the name, as it does the
        starter's."""
        was_running = self.broker.task(task_id).status == "running"
        record = self.broker.cancel_task(task_id)
        if was_running and record.status == "cancelled":
            with self._lock:
                self._cancelled[task_id] = Cancellation(operator)
                while len(self._cancelled) > KEPT_TASKS:
                    del self._cancelled[next(iter(self._cancelled))]
        return record

    def cancellation(self, task_id: int) -> Cancellation | None:
        """Who cancelled the task, if it was cancelled through this server."""
        with self._lock:
            return self._cancelled.get(task_id)

    def running(self, queue: str) -> TaskRecord | None:
        """The task this server is running on ``queue``'s dead letters, if any."""
        with self._lock:
            current = self._by_queue.get(parse_address(queue).entity)
        if isinstance(current, BulkTask) and current.refresh().status == "running":
            return current.record
        return None

    def started(self) -> list[StartedTask]:
        """The tasks this server started, newest first, their records read afresh."""
        with self._lock:
            started = list(reversed(self._started.values()))
        for entry in started:
            entry.task.refresh()  # another process may have cancelled it
        return started

    def started_task(self, task_id: int) -> StartedTask | None:
        """The task with this id, if this server started it."""
        with self._lock:
            return self._started.get(task_id)

    def close(self) -> None:
        with self._lock:
            tasks = [entry.task for entry in self._started.values()]
            self._started.clear()
            self._by_queue.clear()
        for task in tasks:
            if task.status == "running":
                task.cancel()
                task.wait(SHUTDOWN_WAIT)
        if self._owns_broker:
            self.broker.close()

    def _claim(self, queue: str) -> str:
        """Hold ``queue`` for a new task, or raise :class:`TaskRunningError` if this server
        runs one there. Check and hold are one step under the lock, so two requests at once
        (a second tab, a confirmation page brought back by the Back button) cannot both
        start. Tasks other processes run are not seen: the broker lists no tasks."""
        key = parse_address(queue).entity
        with self._lock:
            current = self._by_queue.get(key)
            if isinstance(current, _Starting):
                raise TaskRunningError(key, None)
            if current is not None and current.refresh().status == "running":
                raise TaskRunningError(key, current.id)
            self._by_queue[key] = _STARTING
        return key

    def _track(self, key: str, task: BulkTask, operator: str | None) -> None:
        with self._lock:
            self._by_queue[key] = task
            if task.id not in self._started:
                self._started[task.id] = StartedTask(task, key, operator)
                while len(self._started) > KEPT_TASKS:
                    del self._started[next(iter(self._started))]

    def _release(self, key: str) -> None:
        """A task failed to start: the queue is free again."""
        with self._lock:
            self._by_queue.pop(key, None)


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.poisonq
    return state
