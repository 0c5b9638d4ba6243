"""Tracked bulk tasks over a subqueue: resubmit and purge.

A task is a row in the store with its progress; each chunk moves (or drops) messages and
records the progress in one transaction, so a crash mid-task loses nothing and the recorded
progress is exact. Another process can cancel a task by id; the runner sees it at the next
chunk. Resubmit is paced to ``rate`` messages per second with the broker's clock.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable

from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.errors import InvalidOptionError, PoisonqError, TaskNotFoundError
from poisonq.store.base import MessageFilter, TaskRecord

MAX_CHUNK = 5_000  # messages per transaction of an unthrottled task


class BulkTask:
    """A running or finished resubmit/purge. ``record`` holds the last known progress."""

    def __init__(
        self,
        engine: Engine,
        address: str,
        where: MessageFilter,
        record: TaskRecord,
        rate: float | None,
    ) -> None:
        self.engine = engine
        self.address = address
        self.where = where
        self.record = record
        self.rate = rate
        self._thread: threading.Thread | None = None
        self.error: PoisonqError | None = None

    @property
    def id(self) -> int:
        return self.record.id

    @property
    def done(self) -> int:
        return self.record.done

    @property
    def total(self) -> int:
        return self.record.total

    @property
    def status(self) -> str:
        return self.record.status

    def refresh(self) -> TaskRecord:
        self.record = drive(self.engine.task(self.id))
        return self.record

    def cancel(self, by: str | None = None) -> None:
        """Stop the task after the chunk in progress; what was moved stays moved. ``by``
        names who cancelled it, for the task list."""
        self.record = drive(self.engine.finish_task(self.id, "cancelled", by=by))

    def run(
        self, wait: bool = True, progress: Callable[[BulkTask], None] | None = None
    ) -> BulkTask:
        if wait:
            self._run(progress)
            if self.error is not None:
                raise self.error
        else:
            self._thread = threading.Thread(target=self._run, args=(progress,), daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether its thread (``run(wait=False)``) still runs."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> TaskRecord:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.refresh()

    def _run(self, progress: Callable[[BulkTask], None] | None) -> None:
        clock = self.engine.clock
        chunk = MAX_CHUNK if self.rate is None else max(1, min(MAX_CHUNK, int(self.rate / 5)))
        started = clock.now()
        after = 0
        moved = 0
        try:
            while True:
                seqs = drive(self.engine.task_step(self.id, self.address, self.where, after, chunk))
                self.refresh()
                if progress is not None:
                    progress(self)
                if not seqs:
                    break
                after = seqs[-1]
                moved += len(seqs)
                if self.rate is not None:
                    ahead = started + moved / self.rate - clock.now()
                    if ahead > 0:
                        clock.sleep(ahead)
            self.record = drive(self.engine.finish_task(self.id, "completed"))
        except PoisonqError as exc:
            self.error = exc
            # A task goes with its queue: deleted meanwhile, it has no record left to fail.
            with contextlib.suppress(TaskNotFoundError):
                self.record = drive(self.engine.finish_task(self.id, "failed", str(exc)))


def _check_rate(rate: float | None) -> float | None:
    if rate is None:
        return None
    if isinstance(rate, int | float) and not isinstance(rate, bool) and 0 < rate < math.inf:
        with contextlib.suppress(OverflowError):
            return float(rate)
    raise InvalidOptionError(f"rate must be messages per second > 0 (finite), not {rate!r}")


def resubmit_task(
    engine: Engine,
    address: str,
    where: MessageFilter,
    to: str | None,
    rate: float | None,
    started_by: str | None,
) -> BulkTask:
    rate = _check_rate(rate)
    spec = {"to": to, "rate": rate, "where": where.to_json()}
    record = drive(engine.start_task("resubmit", address, where, spec, started_by))
    return BulkTask(engine, address, where, record, rate)


def purge_task(
    engine: Engine, address: str, where: MessageFilter, started_by: str | None
) -> BulkTask:
    record = drive(
        engine.start_task("purge", address, where, {"where": where.to_json()}, started_by)
    )
    return BulkTask(engine, address, where, record, None)
