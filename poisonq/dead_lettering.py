"""The dead-letter part of the :class:`~poisonq.Broker`: a queue's dead letters read by
group, cause, fingerprint and time, selected by filters, and moved back (resubmit) or dropped
(purge) as tracked tasks (:mod:`poisonq.tasks`). ``orders`` names the dead-letter queue of
``orders`` here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.errors import InvalidOptionError
from poisonq.history import Timeline
from poisonq.history import window as history_window
from poisonq.model import ReceivedMessage, SubQueue
from poisonq.names import NAMESPACE_DEADLETTER, parse_address
from poisonq.selection import check_grouping, message_filter
from poisonq.store.base import DeadLetterCause, DeadLetterGroup, TaskRecord
from poisonq.tasks import BulkTask, purge_task, resubmit_task


class DeadLettering:
    """Dead-letter reads, resubmit and purge tasks, on the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def dead_letter_groups(self, queue: str, by: str = "reason") -> list[DeadLetterGroup]:
        """Dead-lettered messages of ``queue`` grouped by reason, subject or fingerprint."""
        check_grouping(by)
        return drive(self.engine.dead_letter_groups(self._dlq(queue), by))

    def dead_letter_causes(self, queue: str) -> list[DeadLetterCause]:
        """The dead-lettered messages of ``queue`` by reason and by the type of their last
        failure (``None``: never failed), each with a sample's sequence number: what a
        reason such as ``MaxDeliveryCountExceeded`` hides (``WorkerCrashed``,
        ``RuntimeError``, ...)."""
        return drive(self.engine.dead_letter_causes(self._dlq(queue)))

    def dead_letter_fingerprints(self, queue: str) -> dict[str, tuple[str | None, str | None]]:
        """Every failure fingerprint ``queue``'s dead-letter queue has held, each with the
        error type and the description of its first dead letter: kept after the messages
        were resubmitted or purged, so that a chart of the past names each fingerprint by
        its error type."""
        return drive(self.engine.fingerprint_labels(self._dlq(queue)))

    def dead_letter_timeline(self, queue: str, by: str = "reason", window: str = "day") -> Timeline:
        """Messages dead-lettered into ``queue``'s dead-letter queue over the last
        ``window`` (``hour``, ``day`` or ``week``, see :data:`poisonq.history.WINDOWS`), in
        bars, one series per reason, subject or fingerprint. Read from the history the
        store keeps (so every process's work is in it); what was purged or resubmitted
        since still counts."""
        check_grouping(by)
        return drive(self.engine.dead_letter_timeline(self._dlq(queue), by, history_window(window)))

    def dead_letters(
        self,
        /,
        queue: str,
        *,
        after: int = 0,
        limit: int = 100,
        newest_first: bool = False,
        **where: Any,
    ) -> list[ReceivedMessage]:
        """Dead-lettered messages of ``queue`` after sequence number ``after`` matching the
        filters of :meth:`resubmit` (at most ``limit``, oldest first; with ``newest_first``
        the newest, page down with ``max_sequence``): the messages a resubmit or purge with
        the same filters would take."""
        return drive(
            self.engine.find(self._dlq(queue), message_filter(where), after, limit, newest_first)
        )

    def count_dead_letters(self, /, queue: str, **where: Any) -> int:
        """How many dead-lettered messages of ``queue`` match the filters of :meth:`resubmit`."""
        return drive(self.engine.count_matching(self._dlq(queue), message_filter(where)))

    def resubmit(
        self,
        /,
        queue: str,
        *,
        to: str | None = None,
        rate: float | None = 500.0,
        wait: bool = True,
        progress: Callable[[BulkTask], None] | None = None,
        started_by: str | None = None,
        **where: Any,
    ) -> BulkTask:
        """Move dead-lettered messages of ``queue`` back to it (or to ``to``) as a tracked
        task, at most ``rate`` messages per second. Filters: ``reason``, ``subject``,
        ``fingerprint`` (each a value, or :data:`NO_VALUE` for the messages without one),
        ``min_sequence``, ``max_sequence``, ``since``, ``until``, ``message_id``,
        ``body_contains`` (text the body holds).
        With ``wait=False`` the task runs in a thread; ``task.cancel()`` stops it.
        ``started_by`` names who started it in the task list (:meth:`tasks`). While another
        task works on the same messages, :class:`TaskRunningError`."""
        if to is None and queue == NAMESPACE_DEADLETTER:
            raise InvalidOptionError(
                "the namespace dead-letter queue has no queue of its own: resubmit with to=QUEUE"
            )
        if to is not None:
            drive(
                self.engine.get_queue(to)
            )  # an unknown target fails here, not in the task's first chunk
        dlq, chosen = self._dlq(queue), message_filter(where)
        task = resubmit_task(self.engine, dlq, chosen, to, rate, started_by)
        return task.run(wait=wait, progress=progress)

    def purge(
        self,
        /,
        queue: str,
        *,
        wait: bool = True,
        progress: Callable[[BulkTask], None] | None = None,
        started_by: str | None = None,
        **where: Any,
    ) -> BulkTask:
        """Drop dead-lettered messages of ``queue`` that match the filters (all by default),
        as a tracked task. With ``wait=False`` the task runs in a thread; ``task.cancel()``
        stops it. ``started_by`` and a task already running: as :meth:`resubmit`."""
        task = purge_task(self.engine, self._dlq(queue), message_filter(where), started_by)
        return task.run(wait=wait, progress=progress)

    def task(self, task_id: int) -> TaskRecord:
        """A resubmit or purge task's progress, whichever process runs it."""
        return drive(self.engine.task(task_id))

    def tasks(
        self, queue: str | None = None, *, before: int | None = None, limit: int = 50
    ) -> list[TaskRecord]:
        """The resubmit and purge tasks, newest first, whoever ran them: who started and
        who cancelled each, what it selected, at what rate, how far it got. ``queue``
        keeps those of its dead-letter queue; ``before`` a task id, for the next page."""
        return drive(self.engine.tasks(None if queue is None else self._dlq(queue), before, limit))

    def running_task(self, queue: str) -> TaskRecord | None:
        """The task at work on ``queue``'s dead letters, if any: while it runs, another
        resubmit or purge there raises :class:`TaskRunningError`."""
        return drive(self.engine.running_task(self._dlq(queue)))

    def cancel_task(self, task_id: int, by: str | None = None) -> TaskRecord:
        """Cancel a running task; the process running it stops after its current chunk, and
        what was moved stays moved. A finished task stays as it finished. ``by`` names who
        cancelled it in the task list."""
        return drive(self.engine.finish_task(task_id, "cancelled", by=by))

    def _dlq(self, queue: str) -> str:
        """``orders`` means its dead-letter queue here; a subqueue address (or the namespace
        dead-letter queue, see :func:`parse_address`) stays as it is."""
        address = parse_address(queue)
        if address.subqueue is None:
            address = parse_address(queue, SubQueue.DEADLETTER)
        return str(address)
