"""The public Python API: ``poisonq.connect(url)`` gives a :class:`Broker`.

The broker is the one object users hold. It is composed of parts, one per concern, as Service
Bus splits its client from its administration client: :class:`~poisonq.messaging.Messaging`
(senders, receivers, sessions, peeks, settlements),
:class:`~poisonq.administration.Administration` (entities, rules, status, counts, the audit,
housekeeping), :class:`~poisonq.dead_lettering.DeadLettering` (dead-letter reads, resubmit and
purge tasks) and :class:`~poisonq.leasing.Leasing` (leases and pipeline timelines, for the
Spark runtime). Each part depends only on what it uses (the retried engine, or the broker's
:class:`~poisonq.link.Link`), and each part's public methods are the broker's, written once
in the part.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from poisonq.administration import Administration
from poisonq.clock import Clock, ServerClock, SystemClock
from poisonq.dead_lettering import DeadLettering
from poisonq.engine import Engine
from poisonq.leasing import Leasing
from poisonq.link import Link
from poisonq.messaging import Messaging
from poisonq.receivers import MessageOrList, Receiver, Sender, SessionReceiver
from poisonq.retrying import OperationRetry, Reachability, retried, retrying
from poisonq.selection import group_label, grouping_for, spelled_filters
from poisonq.store import open_store, redacted_url
from poisonq.store.base import NO_VALUE, DeadLetterGroup, NoValue, Store, TaskRecord

DEFAULT_URL = "sqlite:///poisonq.db"

P = ParamSpec("P")
R = TypeVar("R")


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


class _Forward(Generic[P, R]):
    """A method of the broker that is one of its part's: ``broker.NAME(...)`` is
    ``broker.PART.NAME(...)``, with the part's signature and docstring (written once, there).
    Set on the class, so that it can be patched there as any method can."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.name: str = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, broker: None, owner: type) -> _Forward[P, R]: ...

    @overload
    def __get__(self, broker: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, broker: object, owner: type) -> _Forward[P, R] | Callable[P, R]:
        if broker is None:
            return self
        method: Callable[P, R] = getattr(getattr(broker, self.part), self.name)

        # The call holds the broker, not only its part: ``connect(url).sender(q)`` makes a
        # sender of a broker nothing else holds, and the part refers to it weakly.
        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            part = getattr(broker, self.part)
            forwarded: Callable[P, R] = getattr(part, self.name)
            return forwarded(*args, **kwargs)

        return call


class Broker:
    """A connection to a poisonq store: messaging, administration, dead letters, leases.

    ``engine`` is the engine with every operation retried over a store outage; ``link`` is
    what the senders and receivers it makes use of it; ``messaging``, ``administration``,
    ``dead_lettering`` and ``leasing`` are its parts, whose methods are its own."""

    def __init__(
        self, store: Store, clock: Clock | None = None, retry: OperationRetry | None = None
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        # Every engine operation, retried on transient errors (an asyncio broker's engine
        # on an event loop's store retries by the same policy, told through the same
        # reachability).
        self.retry = retry or OperationRetry()
        self.reachability = Reachability(redacted_url(store.url))
        self.engine = retrying(Engine(store, self.clock), self.retry, self.reachability)
        # What the senders and receivers it makes use of it.
        self.link = Link(self.engine, self.clock, store)
        self.messaging = Messaging(self)
        self.administration = Administration(self.engine)
        self.dead_lettering = DeadLettering(self.engine)
        self.leasing = Leasing(self.engine)

    @property
    def url(self) -> str:
        return self.store.url

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Administration: entities, rules, status, counts, the audit, housekeeping -------------
    create_queue = _Forward("administration", Administration.create_queue)
    update_queue = _Forward("administration", Administration.update_queue)
    create_topic = _Forward("administration", Administration.create_topic)
    create_subscription = _Forward("administration", Administration.create_subscription)
    rules = _Forward("administration", Administration.rules)
    create_rule = _Forward("administration", Administration.create_rule)
    update_rule = _Forward("administration", Administration.update_rule)
    delete_rule = _Forward("administration", Administration.delete_rule)
    resolve_poison = _Forward("administration", Administration.resolve_poison)
    get_queue = _Forward("administration", Administration.get_queue)
    list_queues = _Forward("administration", Administration.list_queues)
    delete_queue = _Forward("administration", Administration.delete_queue)
    entities = _Forward("administration", Administration.entities)
    set_status = _Forward("administration", Administration.set_status)
    enable = _Forward("administration", Administration.enable)
    disable = _Forward("administration", Administration.disable)
    counts = _Forward("administration", Administration.counts)
    audit = _Forward("administration", Administration.audit)
    housekeep = _Forward("administration", Administration.housekeep)
    queue_trends = _Forward("administration", Administration.queue_trends)

    # Messaging: senders, receivers, sessions, peeks, settlements --------------------------
    change_marker = _Forward("messaging", Messaging.change_marker)
    sender = _Forward("messaging", Messaging.sender)
    receiver = _Forward("messaging", Messaging.receiver)
    accept_session = _Forward("messaging", Messaging.accept_session)
    accept_next_session = _Forward("messaging", Messaging.accept_next_session)
    session_ids = _Forward("messaging", Messaging.session_ids)
    peek = _Forward("messaging", Messaging.peek)
    sequence_span = _Forward("messaging", Messaging.sequence_span)
    message = _Forward("messaging", Messaging.message)
    settle = _Forward("messaging", Messaging.settle)
    settle_held = _Forward("messaging", Messaging.settle_held)

    # Dead letters: reads by group, resubmit and purge tasks -------------------------------
    dead_letter_groups = _Forward("dead_lettering", DeadLettering.dead_letter_groups)
    dead_letter_causes = _Forward("dead_lettering", DeadLettering.dead_letter_causes)
    dead_letter_fingerprints = _Forward("dead_lettering", DeadLettering.dead_letter_fingerprints)
    dead_letter_timeline = _Forward("dead_lettering", DeadLettering.dead_letter_timeline)
    dead_letters = _Forward("dead_lettering", DeadLettering.dead_letters)
    count_dead_letters = _Forward("dead_lettering", DeadLettering.count_dead_letters)
    resubmit = _Forward("dead_lettering", DeadLettering.resubmit)
    purge = _Forward("dead_lettering", DeadLettering.purge)
    task = _Forward("dead_lettering", DeadLettering.task)
    tasks = _Forward("dead_lettering", DeadLettering.tasks)
    running_task = _Forward("dead_lettering", DeadLettering.running_task)
    cancel_task = _Forward("dead_lettering", DeadLettering.cancel_task)

    # Leases and pipeline timelines: what the Spark runtime uses ---------------------------
    acquire_lease = _Forward("leasing", Leasing.acquire_lease)
    lease = _Forward("leasing", Leasing.lease)
    lease_sequence_numbers = _Forward("leasing", Leasing.lease_sequence_numbers)
    lease_rows = _Forward("leasing", Leasing.lease_rows)
    retry_in_lease = _Forward("leasing", Leasing.retry_in_lease)
    renew_lease = _Forward("leasing", Leasing.renew_lease)
    resume_lease = _Forward("leasing", Leasing.resume_lease)
    complete_lease = _Forward("leasing", Leasing.complete_lease)
    plan_lease = _Forward("leasing", Leasing.plan_lease)
    lease_plans = _Forward("leasing", Leasing.lease_plans)
    reset_lease_plans = _Forward("leasing", Leasing.reset_lease_plans)
    release_lease = _Forward("leasing", Leasing.release_lease)
    pipelines = _Forward("leasing", Leasing.pipelines)
    forget_pipeline = _Forward("leasing", Leasing.forget_pipeline)
    pipeline_batches = _Forward("leasing", Leasing.pipeline_batches)


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
    "group_label",
    "grouping_for",
    "spelled_filters",
]
