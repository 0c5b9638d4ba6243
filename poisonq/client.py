"""The public Python API: ``poisonq.connect(url)`` gives a :class:`Broker`.

The broker hands out senders and receivers bound to one address (:mod:`poisonq.receivers`)
and exposes the admin operations. Everything here calls the engine; nothing touches the store
directly except the long-poll wait, which asks the store whether anything changed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from poisonq.clock import Clock, ServerClock, SystemClock
from poisonq.engine import Engine
from poisonq.engine.targets import check_text
from poisonq.errors import (
    InvalidOptionError,
    MessageLockLostError,
)
from poisonq.filters import Filter, Rule, RuleSet, make_filter
from poisonq.history import Timeline, Trend
from poisonq.history import window as history_window
from poisonq.limits import check_count
from poisonq.link import Link
from poisonq.lock_renewer import AutoLockRenewer, check_renewer
from poisonq.model import (
    Duration,
    EntityKind,
    EntityStatus,
    FaultAction,
    Lease,
    PropertyValue,
    ReceivedMessage,
    ReceiveMode,
    Settlement,
    SubQueue,
    to_seconds,
    to_timestamp,
)
from poisonq.names import NAMESPACE_DEADLETTER, parse_address
from poisonq.options import QueueOptions
from poisonq.receivers import (
    RECEIVE_WAIT,
    MessageOrList,
    Receiver,
    Sender,
    SessionReceiver,
    lock_seconds,
    wait_for,
)
from poisonq.reports import AuditReport, QueueInfo
from poisonq.retrying import OperationRetry, Reachability, retried, retrying
from poisonq.store import open_store, redacted_url
from poisonq.store.base import (
    NO_VALUE,
    DeadLetterCause,
    DeadLetterGroup,
    MessageFilter,
    NoValue,
    Store,
    TaskRecord,
)
from poisonq.tasks import BulkTask, purge_task, resubmit_task
from poisonq.timeline import BatchRun, PipelineBatch, PipelineSummary

log = logging.getLogger(__name__)

DEFAULT_URL = "sqlite:///poisonq.db"
VALUE_FILTERS = ("reason", "subject", "fingerprint")
MAX_RULE_NAME = 50  # Service Bus' limit on a rule's name


def grouping_for(where: dict[str, Any]) -> str:
    """The grouping that shows what a selection missed: the first value filter it has,
    else the reason (a resubmit or purge that selects nothing shows the groups there are)."""
    return next((name for name in VALUE_FILTERS if name in where), "reason")


def connect(
    url: str = DEFAULT_URL,
    *,
    clock: Clock | None = None,
    create: bool = True,
    retry_total: int = 3,
    retry_backoff_factor: float = 0.8,
    retry_backoff_max: float = 120.0,
) -> Broker:
    """Open the store ``url`` names (``sqlite:///path`` or ``postgresql://...``). With
    ``create=False`` a SQLite file that does not exist raises :class:`StoreNotFoundError`
    instead of being made: what a tool that only reads or sends wants. An operation that
    meets a transient store error (:class:`StoreUnavailableError`: a server restarting, a
    lost connection, a busy SQLite file) is retried ``retry_total`` times with exponential
    backoff (see :mod:`poisonq.retrying`), apart from any message's delivery count.

    Time is the store's clock: without ``clock``, a PostgreSQL store's clients follow the
    database server's clock (:class:`~poisonq.clock.ServerClock`), so that a client on a host
    whose clock is off neither expires other clients' locks nor keeps what is due; a SQLite
    store's is the local clock. A ``clock`` given here (a test's ``ManualClock``) wins."""
    retry = OperationRetry(retry_total, retry_backoff_factor, retry_backoff_max)
    reachability = Reachability(redacted_url(url))
    store = retried(open_store, retry, reachability)(url, create=create)  # it may be restarting
    if clock is None and store.has_server_clock:
        try:
            clock = retried(ServerClock, retry, reachability)(store.server_offset)
        except BaseException:
            store.close()
            raise
    return Broker(store, clock or SystemClock(), retry)


def spelled_filters(where: Mapping[str, Any]) -> dict[str, Any]:
    """Filter keyword arguments as the command line, the HTTP API and the web UI spell them:
    ``none`` as a reason, subject or fingerprint is :data:`NO_VALUE` (the messages without
    one)."""
    spelling = str(NO_VALUE)
    return {
        name: NO_VALUE if name in VALUE_FILTERS and value == spelling else value
        for name, value in where.items()
    }


def _filter(where: dict[str, Any]) -> MessageFilter:
    """A message filter from keyword arguments, refusing unknown names and values of the
    wrong kind (a task records its filter, and a store compares them with its columns)."""
    try:
        wanted = MessageFilter(**where)
    except TypeError:
        known = ", ".join(MessageFilter.__dataclass_fields__)
        raise InvalidOptionError(f"unknown filter in {sorted(where)}; use {known}") from None
    for name in (*VALUE_FILTERS, "session_id"):
        value = getattr(wanted, name)
        if not isinstance(value, NoValue) or name == "session_id":
            check_text(value, name)
    for name in ("min_sequence", "max_sequence"):
        if getattr(wanted, name) is not None:
            check_count(getattr(wanted, name), name, minimum=0)
    since, until = (None if t is None else to_timestamp(t) for t in (wanted.since, wanted.until))
    # A range that is empty by construction is a typo, not a search: say so rather than
    # answer "no messages" (``until`` is exclusive).
    if since is not None and until is not None and until <= since:
        raise InvalidOptionError("until must be later than since (the range is empty)")
    low, high = wanted.min_sequence, wanted.max_sequence
    if low is not None and high is not None and high < low:
        raise InvalidOptionError("max_sequence must not be below min_sequence")
    return dataclasses.replace(wanted, since=since, until=until)


def _rule_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_RULE_NAME:
        raise InvalidOptionError(f"a rule name is 1-{MAX_RULE_NAME} characters, not {name!r}")
    check_text(name, "a rule name")
    return name


def _rule(spec: Rule | str | dict[str, PropertyValue] | None) -> Rule:
    rule = make_filter(spec)
    if isinstance(rule, RuleSet):
        raise InvalidOptionError("a rule is one filter, not a set of rules")
    return rule


def _check_grouping(by: str) -> None:
    if by not in ("reason", "subject", "fingerprint"):
        raise InvalidOptionError(f"group by reason, subject or fingerprint, not {by!r}")


class Broker:
    """A connection to a poisonq store: admin operations, senders and receivers."""

    def __init__(
        self, store: Store, clock: Clock | None = None, retry: OperationRetry | None = None
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        # Every engine operation, retried on transient errors.
        reachability = Reachability(redacted_url(store.url))
        self.engine = retrying(Engine(store, self.clock), retry or OperationRetry(), reachability)
        # What the senders and receivers it makes use of it.
        self.link = Link(self.engine, self.clock, store)

    @property
    def url(self) -> str:
        return self.store.url

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Admin --------------------------------------------------------------------------------
    def create_queue(
        self, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        """Create a queue (and its subqueues). Options: see :class:`QueueOptions`."""
        built = QueueOptions.build(None, max_delivery_count=max_delivery_count, **options)
        return self.engine.create_queue(name, built)

    def update_queue(
        self, name: str, *, max_delivery_count: int | None = None, **options: Any
    ) -> QueueInfo:
        """Change options; ``max_delivery_count`` changes the attempts per cycle and keeps
        the rest of the retry policy (see :meth:`QueueOptions.build`)."""
        if max_delivery_count is not None:
            options["max_delivery_count"] = max_delivery_count
        return self.engine.update_queue(name, **options)

    def create_topic(self, name: str, **options: Any) -> QueueInfo:
        """Create a topic: what is sent to it goes to each subscription whose filter matches.
        Options as for a queue (size limits apply to what is sent to the topic)."""
        built = QueueOptions.build(None, **options)
        return self.engine.create_queue(name, built, EntityKind.TOPIC)

    def create_subscription(
        self,
        topic: str,
        name: str,
        *,
        filter: Filter | str | dict[str, PropertyValue] | None = None,
        dead_letter_on_filter_evaluation_exceptions: bool = False,
        max_delivery_count: int | None = None,
        **options: Any,
    ) -> QueueInfo:
        """Create subscription ``topic/subscriptions/name``: a queue of its own (with its own
        dead-letter queue) receiving a copy of each message sent to the topic that ``filter``
        matches: SQL text (``"region = 'eu' AND amount > 100"``), a dict of properties that
        must all be equal (a correlation filter), or ``None`` for every message. Invalid
        filter text raises :class:`FilterError`."""
        built = QueueOptions.build(None, max_delivery_count=max_delivery_count, **options)
        rule = make_filter(filter)
        flag = dead_letter_on_filter_evaluation_exceptions
        if not isinstance(flag, bool):
            raise InvalidOptionError("dead_letter_on_filter_evaluation_exceptions must be a bool")
        return self.engine.create_subscription(topic, name, built, rule, flag)

    def rules(self, topic: str, subscription: str) -> dict[str, Rule]:
        """Subscription ``topic/subscriptions/subscription``'s rules by name: a message
        sent to the topic reaches it when any of them matches. The filter it was created
        with is its rule ``$Default``."""
        return dict(self.engine.rules(topic, subscription))

    def create_rule(
        self,
        topic: str,
        subscription: str,
        name: str,
        filter: Rule | str | dict[str, PropertyValue] | None = None,
    ) -> None:
        """Add rule ``name`` to a subscription (``filter`` as for :meth:`create_subscription`;
        ``None`` matches every message); a name it has raises :class:`EntityExistsError`."""
        self.engine.change_rule(topic, subscription, _rule_name(name), _rule(filter), True)

    def update_rule(
        self,
        topic: str,
        subscription: str,
        name: str,
        filter: Rule | str | dict[str, PropertyValue] | None = None,
    ) -> None:
        """Replace rule ``name``'s filter; a rule the subscription does not have raises
        :class:`EntityNotFoundError`."""
        self.engine.change_rule(topic, subscription, _rule_name(name), _rule(filter), False)

    def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        """Remove rule ``name`` (:class:`EntityNotFoundError` if there is none); a
        subscription without rules receives nothing, as in Service Bus."""
        self.engine.change_rule(topic, subscription, _rule_name(name), None, False)

    def resolve_poison(
        self,
        address: str,
        sequence_number: int,
        action: FaultAction = "move",
        *,
        enable: bool = True,
    ) -> QueueInfo:
        """The operator's way out of a fault: ``move`` message ``sequence_number`` to the
        dead-letter queue, ``drop`` it or ``resubmit`` it (fresh delivery count, back of the
        queue), and with ``enable`` make the queue active again, all in one transaction."""
        return self.engine.resolve_poison(address, sequence_number, action, enable)

    def get_queue(self, address: str) -> QueueInfo:
        return self.engine.get_queue(address)

    def list_queues(self) -> list[QueueInfo]:
        return self.engine.list_queues()

    def delete_queue(self, name: str) -> None:
        self.engine.delete_queue(name)

    def entities(self) -> list[QueueInfo]:
        """Every queue and each of its subqueues (dead-letter, retry, transfer dead-letter)
        with counts and ledger, by name: what an operator's overview and metrics show."""
        return self.engine.list_entities()

    def set_status(
        self, address: str, status: EntityStatus | str, cause: str | None = None
    ) -> None:
        try:
            status = EntityStatus(status)
        except ValueError:
            choices = ", ".join(s.value for s in EntityStatus)
            raise InvalidOptionError(f"status must be one of {choices}, not {status!r}") from None
        self.engine.set_status(address, status, cause)

    def enable(self, address: str) -> None:
        self.set_status(address, EntityStatus.ACTIVE)

    def disable(self, address: str) -> None:
        self.set_status(address, EntityStatus.DISABLED)

    def counts(self, address: str) -> dict[str, int]:
        """Messages held by state, plus the dead-letter depth and lifetime completions/drops."""
        return self.engine.counts(address)

    def change_marker(self) -> object:
        """An opaque value that changes whenever the store commits a write, from any process:
        comparing two tells cheaply whether anything may have arrived. Messages also become
        receivable without a commit (scheduled ones, expired locks), so look again now and
        then even when it has not changed."""
        return self.store.change_marker()

    def audit(self) -> AuditReport:
        """Check that every message sent is completed, dropped or still held somewhere."""
        return self.engine.audit()

    def housekeep(self) -> list[str]:
        """Apply what is due on the store's clock (locks that ran out, time-to-lives that
        passed, scheduled messages and retry cycles whose time came, the auto-disable they
        may cause) to every entity, one transaction each; the names of those where
        something was. Every read applies as much for what it reads: this is for time to
        pass where nobody reads (``poisonq housekeep``, the server's loop)."""
        return self.engine.housekeep()

    # Messaging ----------------------------------------------------------------------------
    def sender(self, address: str) -> Sender:
        return Sender(self, address)

    def receiver(
        self,
        address: str,
        *,
        subqueue: SubQueue | str | None = None,
        receive_mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK,
        lock_duration: Duration | None = None,
        max_wait_time: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> Receiver:
        """A receiver of ``address`` (or its ``subqueue``). ``max_wait_time`` ends an
        iteration (``for message in receiver``) once no message has come for that long.
        With ``auto_lock_renewer``, the messages it receives are registered with it."""
        try:
            mode = ReceiveMode(receive_mode)
        except ValueError:
            choices = ", ".join(m.value for m in ReceiveMode)
            raise InvalidOptionError(f"receive_mode must be one of {choices}") from None
        check_renewer(auto_lock_renewer)
        return Receiver(
            self, address, subqueue, mode, lock_duration, max_wait_time, auto_lock_renewer
        )

    def accept_session(
        self,
        address: str,
        session_id: str,
        *,
        lock_duration: Duration | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> SessionReceiver:
        """Lock session ``session_id`` of a session-enabled queue; raises
        :class:`SessionCannotBeLockedError` if another receiver holds it. With
        ``auto_lock_renewer``, the session is registered with it until it is closed."""
        if session_id is None:  # the engine would take the next session (accept_next_session)
            raise InvalidOptionError("name the session to accept, not None")
        check_renewer(auto_lock_renewer)
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        got = self.engine.accept_session(address, session_id, seconds)
        assert got is not None, "a named session is locked or refused"
        return SessionReceiver(self, address, seconds, *got, auto_lock_renewer)

    def accept_next_session(
        self,
        address: str,
        *,
        lock_duration: Duration | None = None,
        max_wait: Duration = RECEIVE_WAIT,
        auto_lock_renewer: AutoLockRenewer | None = None,
    ) -> SessionReceiver | None:
        """Lock the next session with a message waiting that nobody holds, waiting up to
        ``max_wait`` (a minute by default, as a Service Bus client waits; 0 looks once) for
        one to arrive or to be given up; ``None`` if none came. ``auto_lock_renewer`` as in
        :meth:`accept_session`."""
        check_renewer(auto_lock_renewer)
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        wait = to_seconds(max_wait, "max_wait")
        deadline = time.monotonic() + wait
        marker = self.store.change_marker() if wait > 0 else None

        def look() -> tuple[str, str, float] | None:
            return self.engine.accept_session(address, None, seconds)

        got = wait_for(self.store, deadline, marker, look(), look)
        if got is None:
            return None
        return SessionReceiver(self, address, seconds, *got, auto_lock_renewer)

    def session_ids(
        self, address: str, *, state_updated_after: datetime | float | None = None
    ) -> list[str]:
        """The sessions of session queue ``address`` that have a message (waiting, locked,
        deferred or scheduled) or a state, by id; with ``state_updated_after``, those whose
        state was set after that time (azure-servicebus' ``list_queue_sessions``)."""
        after = None if state_updated_after is None else to_timestamp(state_updated_after)
        return self.engine.session_ids(address, after)

    def peek(
        self, address: str, *, from_sequence: int = 0, max_messages: int = 100, **where: Any
    ) -> list[ReceivedMessage]:
        """Messages without locking them or counting a delivery; the filters of
        :meth:`resubmit` (``subject="order"``, ``fingerprint=NO_VALUE``, ...) narrow them."""
        return self.engine.peek(address, from_sequence, max_messages, _filter(where))

    def sequence_span(self, address: str) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number held by ``address``; (0, 0, -1) if empty.
        Spark splits a read into partitions by this range."""
        return self.engine.sequence_span(address)

    def message(self, address: str, sequence_number: int) -> ReceivedMessage:
        """One message by sequence number, with its failure history."""
        return self.engine.message(address, sequence_number)

    def settle(self, address: str, settlements: Sequence[Settlement]) -> list[int]:
        """Settle many locked messages, each its own way (:class:`Complete`,
        :class:`Abandon`, :class:`DeadLetter`, :class:`Release`), in one transaction. A
        lost lock raises :class:`MessageLockLostError` and changes nothing. Returns the
        sequence numbers the retry policy poisoned."""
        return self.engine.settle(address, settlements)

    def settle_held(
        self, address: str, settlements: Sequence[Settlement]
    ) -> tuple[list[int], list[int]]:
        """:meth:`settle` what is still held: settlements whose lock ran out are left out
        (those messages will be delivered again) and the rest settled in one transaction.
        Returns (poisoned, lost) sequence numbers."""
        pending = {s.sequence_number: s for s in settlements}
        lost: list[int] = []
        while pending:
            try:
                return self.engine.settle(address, list(pending.values())), lost
            except MessageLockLostError as exc:
                log.warning("lost the lock on message(s) %s", exc.sequence_numbers)
                lost += exc.sequence_numbers
                for seq in exc.sequence_numbers:
                    del pending[seq]
        return [], lost

    # Leases: the batches Spark queries lock ---------------------------------------------
    def acquire_lease(
        self,
        address: str,
        consumer: str,
        number: int,
        max_messages: int,
        lock_duration: Duration | None = None,
    ) -> Lease | None:
        """Lock up to ``max_messages`` messages as lease ``number`` of ``consumer``, or get
        that lease again (renewed) if it exists. ``None`` when nothing is receivable."""
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return self.engine.acquire_lease(address, consumer, number, max_messages, seconds)

    def lease(self, address: str, consumer: str, number: int | None = None) -> Lease | None:
        """The consumer's lease ``number`` (its latest by default), if it still exists."""
        return self.engine.lease(address, consumer, number)

    def lease_sequence_numbers(
        self,
        lease: Lease,
        lo: int | None = None,
        hi: int | None = None,
        *,
        first_delivery: bool = False,
    ) -> list[int]:
        """The sequence numbers in ``[lo, hi]`` the lease still holds under a valid lock;
        with ``first_delivery``, only the messages delivered for the first time."""
        return self.engine.lease_sequence_numbers(lease, lo, hi, first_delivery)

    def lease_rows(
        self, lease: Lease, lo: int | None = None, hi: int | None = None
    ) -> list[tuple[Any, ...]]:
        """The messages the lease still holds, as tuples of
        :data:`poisonq.store.base.LEASE_COLUMNS` (what Spark executors read)."""
        return self.engine.lease_rows(lease, lo, hi)

    def renew_lease(self, lease: Lease, lock_duration: Duration | None = None) -> int:
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return self.engine.renew_lease(lease, seconds)

    def resume_lease(self, lease: Lease, lock_duration: Duration | None = None) -> int:
        """Renew the lease's locks, reviving those that ran out if nothing reclaimed their
        messages since (a replay after a restart); returns how many messages it holds."""
        seconds = None if lock_duration is None else lock_seconds(lock_duration)
        return self.engine.resume_lease(lease, seconds)

    def complete_lease(self, lease: Lease, run: BatchRun | None = None) -> int:
        """Complete what the lease still holds; returns how many were completed. With
        ``run`` (its job's start, duration and isolation jobs), the batch is recorded in the
        consumer's timeline in the same transaction (see :meth:`pipeline_batches`)."""
        return self.engine.complete_lease(lease, run)

    def plan_lease(self, lease: Lease) -> int:
        """Count a planning of the lease's batch; returns how many times it was planned
        (more than once: a replay)."""
        return self.engine.plan_lease(lease)

    def lease_plans(self, lease: Lease) -> int:
        """How many times the lease's batch was planned (without counting one more)."""
        return self.engine.lease_plans(lease)

    def reset_lease_plans(self, lease: Lease) -> None:
        """Count the lease's batch as not planned yet (a handler that isolates its own
        failures took it up: a later planning is a restart's replay, not narrowed)."""
        self.engine.reset_lease_plans(lease)

    def release_lease(self, lease: Lease, lo: int | None = None, hi: int | None = None) -> int:
        """Give back what the lease still holds in ``[lo, hi]`` (all of it by default) as if
        never delivered: no delivery counted, no failure recorded. Returns how many."""
        return self.engine.release_lease(lease, lo, hi)

    # Pipeline timelines -------------------------------------------------------------------
    def pipelines(self) -> list[PipelineSummary]:
        """Every consumer with recorded pipeline batches, with its last batch."""
        return self.engine.pipelines()

    def forget_pipeline(
        self, consumer: str, queue: str | None = None, *, force: bool = False
    ) -> PipelineSummary:
        """Forget a retired pipeline consumer: its timeline (so its metrics, and the
        ``PoisonqPipelineStalled`` alert, go) and its settled leases. Refused with
        :class:`~poisonq.errors.PipelineLeaseHeldError` while its latest lease holds
        messages under a live lock, unless ``force`` (they go back to the queue, no delivery
        counted). Returns the consumer's summary as it was."""
        return self.engine.forget_pipeline(consumer, queue, force)

    def pipeline_batches(self, consumer: str, queue: str | None = None) -> list[PipelineBatch]:
        """The batches recorded for ``consumer``, oldest first (its last ``keep``: see
        :class:`~poisonq.spark.Pipeline`). ``queue`` is needed only when the consumer runs
        on several queues; :class:`PipelineNotFoundError` when nothing is recorded."""
        return self.engine.pipeline_batches(consumer, queue)

    # Dead-letter operations ---------------------------------------------------------------
    def dead_letter_groups(self, queue: str, by: str = "reason") -> list[DeadLetterGroup]:
        """Dead-lettered messages of ``queue`` grouped by reason, subject or fingerprint."""
        _check_grouping(by)
        return self.engine.dead_letter_groups(self._dlq(queue), by)

    def dead_letter_causes(self, queue: str) -> list[DeadLetterCause]:
        """The dead-lettered messages of ``queue`` by reason and by the type of their last
        failure (``None``: never failed), each with a sample's sequence number: what a
        reason such as ``MaxDeliveryCountExceeded`` hides (``WorkerCrashed``,
        ``RuntimeError``, ...)."""
        return self.engine.dead_letter_causes(self._dlq(queue))

    def dead_letter_fingerprints(self, queue: str) -> dict[str, tuple[str | None, str | None]]:
        """Every failure fingerprint ``queue``'s dead-letter queue has held, each with the
        error type and the description of its first dead letter: kept after the messages
        were resubmitted or purged, so that a chart of the past names each fingerprint by
        its error type."""
        return self.engine.fingerprint_labels(self._dlq(queue))

    def dead_letter_timeline(self, queue: str, by: str = "reason", window: str = "day") -> Timeline:
        """Messages dead-lettered into ``queue``'s dead-letter queue over the last
        ``window`` (``hour``, ``day`` or ``week``, see :data:`poisonq.history.WINDOWS`), in
        bars, one series per reason, subject or fingerprint. Read from the history the
        store keeps (so every process's work is in it); what was purged or resubmitted
        since still counts."""
        _check_grouping(by)
        return self.engine.dead_letter_timeline(self._dlq(queue), by, history_window(window))

    def queue_trends(self) -> dict[str, Trend]:
        """Every queue's depth and dead-letterings over the last day, by the hour."""
        return self.engine.queue_trends()

    def dead_letters(
        self,
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
        return self.engine.find(self._dlq(queue), _filter(where), after, limit, newest_first)

    def count_dead_letters(self, queue: str, **where: Any) -> int:
        """How many dead-lettered messages of ``queue`` match the filters of :meth:`resubmit`."""
        return self.engine.count_matching(self._dlq(queue), _filter(where))

    def resubmit(
        self,
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
            self.get_queue(to)  # an unknown target fails here, not in the task's first chunk
        dlq, chosen = self._dlq(queue), _filter(where)
        task = resubmit_task(self.engine, dlq, chosen, to, rate, started_by)
        return task.run(wait=wait, progress=progress)

    def purge(
        self,
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
        task = purge_task(self.engine, self._dlq(queue), _filter(where), started_by)
        return task.run(wait=wait, progress=progress)

    def task(self, task_id: int) -> TaskRecord:
        """A resubmit or purge task's progress, whichever process runs it."""
        return self.engine.task(task_id)

    def tasks(
        self, queue: str | None = None, *, before: int | None = None, limit: int = 50
    ) -> list[TaskRecord]:
        """The resubmit and purge tasks, newest first, whoever ran them: who started and
        who cancelled each, what it selected, at what rate, how far it got. ``queue``
        keeps those of its dead-letter queue; ``before`` a task id, for the next page."""
        return self.engine.tasks(None if queue is None else self._dlq(queue), before, limit)

    def running_task(self, queue: str) -> TaskRecord | None:
        """The task at work on ``queue``'s dead letters, if any: while it runs, another
        resubmit or purge there raises :class:`TaskRunningError`."""
        return self.engine.running_task(self._dlq(queue))

    def cancel_task(self, task_id: int, by: str | None = None) -> TaskRecord:
        """Cancel a running task; the process running it stops after its current chunk, and
        what was moved stays moved. A finished task stays as it finished. ``by`` names who
        cancelled it in the task list."""
        return self.engine.finish_task(task_id, "cancelled", by=by)

    def _dlq(self, queue: str) -> str:
        """``orders`` means its dead-letter queue here; a subqueue address (or the namespace
        dead-letter queue, see :func:`parse_address`) stays as it is."""
        address = parse_address(queue)
        if address.subqueue is None:
            address = parse_address(queue, SubQueue.DEADLETTER)
        return str(address)


__all__ = [
    "DEFAULT_URL",
    "NO_VALUE",
    "Broker",
    "DeadLetterGroup",
    "MessageOrList",
    "NoValue",
    "Receiver",
    "Sender",
    "SessionReceiver",
    "TaskRecord",
    "connect",
    "spelled_filters",
]
