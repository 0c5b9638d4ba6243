"""The store contract every backend implements.

A store persists entities and messages and performs *guarded* transitions: each change names
the state (and lock token) it expects and reports how many rows it changed, so the engine can
raise instead of silently doing nothing. Each transition method also keeps the entity's ledger
(sent, moved in/out, completed, dropped, bytes held) in the same transaction, which is what
makes ``poisonq audit`` able to prove that nothing was lost. Which transition to run, and when,
is the engine's business: the store has no policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from enum import Enum
from importlib import resources
from typing import Any, ClassVar, Final, NamedTuple

from poisonq.errors import (
    BrokerClosedError,
    InvalidOperationError,
    InvalidOptionError,
    SchemaVersionError,
)
from poisonq.model import EntityStatus, Lease, MessageState, ReceivedMessage, SubQueue
from poisonq.store.history import HistoryKeeper
from poisonq.timeline import PipelineBatch, PipelineSummary

# The columns of :meth:`Transaction.lease_rows`, in order. Times are epoch seconds and
# ``properties`` is the JSON text the message was sent with (or None).
LEASE_COLUMNS = (
    "sequence_number",
    "message_id",
    "body",
    "content_type",
    "subject",
    "properties",
    "session_id",
    "correlation_id",
    "enqueued_time",
    "delivery_count",
)


@dataclass(frozen=True, slots=True)
class Ledger:
    """Lifetime counters of one entity. ``sent + moved_in = completed + dropped + moved_out +
    held`` at every commit."""

    sent: int = 0
    moved_in: int = 0
    completed: int = 0
    dropped: int = 0
    moved_out: int = 0
    dead_lettered: int = 0
    resubmitted: int = 0
    lock_expiries: int = 0
    size_bytes: int = 0
    abandoned: int = 0  # abandons by a receiver; lock expiries are counted apart
    poisoned: int = 0  # messages the retry policy dead-lettered or dropped

    @property
    def held(self) -> int:
        """The messages held now, by the ledger's count (the audit checks it by the rows)."""
        return self.sent + self.moved_in - self.completed - self.dropped - self.moved_out


@dataclass(frozen=True, slots=True)
class EntityRecord:
    """An entity row: a queue, or one of a queue's subqueues (``parent_id`` set)."""

    id: int
    name: str
    parent_id: int | None
    subqueue: SubQueue | None
    status: EntityStatus
    status_cause: str | None
    options: str
    created_at: float
    updated_at: float
    ledger: Ledger
    rollbacks: int = 0  # abandons and lock expiries since the last completion


@dataclass(slots=True)
class NewMessage:
    """A message row about to be inserted, already validated and sized by the engine."""

    message_id: str
    body: bytes
    size: int
    content_type: str | None
    subject: str | None
    properties: str | None
    session_id: str | None
    correlation_id: str | None
    reply_to: str | None
    state: MessageState
    scheduled_at: float | None
    expires_at: float | None
    to_address: str | None = None
    reply_to_session_id: str | None = None
    partition_key: str | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """The counters the retry policy decides on, for one locked message.
    ``dead_lettered_deliveries`` is ``delivery_count`` as it was when the message was
    dead-lettered (0 before that)."""

    seq: int
    delivery_count: int
    move_count: int
    dead_lettered_deliveries: int = 0


class Deleted(NamedTuple):
    """The ledgers of every entity deleted, summed as they were when each went, and the
    messages they still held then (``discarded``, which the audit counts as dropped)."""

    sent: int = 0
    moved_in: int = 0
    completed: int = 0
    dropped: int = 0
    moved_out: int = 0
    discarded: int = 0


class Letter(NamedTuple):
    """A message to dead-letter with what it carries: its reason, its description (``None``:
    its last recorded failure describes it) and the failure to append to its history (a
    :meth:`FailureRecord.to_json <poisonq.model.FailureRecord.to_json>` object, or ``None``).
    Every failed message's record differs, so a batch's letters move in one statement
    (:meth:`Transaction.dead_letter_each`) rather than one per reason and failure."""

    seq: int
    reason: str
    description: str | None
    failure: dict[str, Any] | None


def all_alike(letters: Sequence[Letter]) -> Letter | None:
    """The first of ``letters`` if every one shares its reason, description and failure (the
    same record), else ``None``: a store binds what such letters share once. (Also ``None``
    for no letters.)"""
    if not letters:
        return None
    first = letters[0]
    for letter in letters:
        if (
            letter.failure is not first.failure
            or letter.reason != first.reason
            or letter.description != first.description
        ):
            return None
    return first


@dataclass(frozen=True, slots=True)
class DeadLetterGroup:
    """Dead-lettered messages sharing one key (reason, subject or fingerprint)."""

    key: str | None
    label: str | None
    count: int
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class DeadLetterCause:
    """Dead-lettered messages of one reason whose last failure had one type (``None``: the
    messages that never failed), with the lowest sequence number among them as a sample."""

    reason: str | None
    error_type: str | None
    count: int
    sample: int


@dataclass(frozen=True, slots=True)
class DeadLetterCount:
    """Messages dead-lettered into an entity in one bucket of the history, of one key."""

    entity_id: int
    bucket: int
    key: str | None
    count: int


@dataclass(frozen=True, slots=True)
class DepthChange:
    """A bucket of the history in which an entity's depth changed, the depth it had before
    the bucket's first change, and the highest it reached in the bucket (None: a bucket
    written before schema 10 kept no peak)."""

    entity_id: int
    bucket: int
    opened: int
    peak: int | None = None


class NoValue(Enum):
    """The type of :data:`NO_VALUE`. Its value is how every surface spells it (``none``)."""

    NO_VALUE = "none"

    def __str__(self) -> str:
        return self.value


NO_VALUE: Final = NoValue.NO_VALUE
"""A filter on ``reason``, ``subject`` or ``fingerprint`` equal to this selects the messages
that have none (SQL ``IS NULL``), such as the dead letters that never failed and so have no
fingerprint; ``None`` means no filter on that field."""


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Which messages of an entity a bulk operation (resubmit, purge) or a peek selects."""

    reason: str | NoValue | None = None
    subject: str | NoValue | None = None
    fingerprint: str | NoValue | None = None
    min_sequence: int | None = None
    max_sequence: int | None = None
    since: float | None = None
    until: float | None = None
    session_id: str | None = None
    message_id: str | None = None
    body_contains: str | None = None  # its UTF-8 bytes anywhere in the body

    def to_json(self) -> dict[str, Any]:
        """The filter as a task records it, :data:`NO_VALUE` as its spelling ``none``."""
        return {k: str(v) if isinstance(v, NoValue) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session of a session-enabled entity: who holds its lock, and its stored state."""

    session_id: str
    lock_token: str | None
    locked_until: float | None
    state: bytes | None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A tracked bulk operation (a resubmit or a purge) with its progress, and who started
    and cancelled it (None: not said, or before the store kept it)."""

    id: int
    kind: str
    entity_id: int
    entity: str  # the name of the entity it takes messages from
    status: str
    spec: dict[str, Any]
    total: int
    done: int
    created_at: float
    updated_at: float
    error: str | None
    started_by: str | None
    cancelled_by: str | None


class Transaction(ABC):
    """One store transaction. Every method runs inside it; all commit or none do."""

    @abstractmethod
    async def receive_follows(self, entity_id: int) -> None:
        """The caller says this transaction will settle messages of the entity and then
        receive from it (a consumer loop's ``complete_and_receive``): a store whose
        statements cost a round trip each may send the receive's housekeeping reads with the
        settlement."""

    @abstractmethod
    async def lease_follows(self, entity_id: int) -> None:
        """The caller says this transaction will lock a lease's batch of the entity
        (:meth:`lock_lease`) after its housekeeping: a store whose lease excludes other
        claims for a while may exclude them from the first claim of the transaction on
        (PostgreSQL: a lock held shared and then asked for exclusive could wait for
        another transaction doing the same)."""

    # Entities -----------------------------------------------------------------------------
    @abstractmethod
    async def insert_entity(
        self,
        name: str,
        parent_id: int | None,
        subqueue: SubQueue | None,
        options: str,
        now: float,
    ) -> int:
        """Create an entity with its options as JSON text; raises ``EntityExistsError`` if the
        name is taken."""

    @abstractmethod
    async def entity(self, name: str) -> EntityRecord | None: ...

    @abstractmethod
    async def entity_by_id(self, entity_id: int) -> EntityRecord: ...

    @abstractmethod
    async def entities(self) -> list[EntityRecord]:
        """Every entity, subqueues included, by name."""

    @abstractmethod
    async def set_options(self, entity_id: int, options: str, now: float) -> None: ...

    @abstractmethod
    async def set_status(
        self, entity_id: int, status: EntityStatus, cause: str | None, now: float
    ) -> None: ...

    @abstractmethod
    async def delete_entity(self, entity_id: int, now: float) -> None:
        """Delete an entity with its subqueues and every message they hold, keeping what
        each one's ledger held in ``deleted_entities`` (schema 19) for the audit."""

    @abstractmethod
    async def held_counts(
        self, entity_id: int, ready: MessageState, held: int
    ) -> dict[MessageState, int]:
        """Messages held by the entity, by state, given how many it holds (``held``, by its
        ledger): the states other than ``ready`` are counted, which costs what they hold,
        and ``ready`` has the rest, so a queue of millions is counted at the cost of what
        is locked, deferred or scheduled in it."""

    @abstractmethod
    async def audit_rows(self) -> tuple[list[tuple[EntityRecord, int]], Deleted]:
        """Every entity with the messages it holds, counted row by row, and the ledgers of
        the entities deleted, summed, all read at one moment: what the audit checks."""

    @abstractmethod
    async def housekeeping_due(self, entity_id: int, cycle_id: int, now: float) -> bool:
        """Whether anything of the entity is due by ``now``: a lock (or a lease's cover) that
        ran out, a scheduled message whose time has come (here or in ``cycle_id``, the
        retry subqueue whose messages come back to it; the entity's own id for none), an
        unlocked message past its time to live (a deferred message never expires). A read,
        and a cheap one: every reader asks it first."""

    @abstractmethod
    async def entities_due(self, now: float) -> list[str]:
        """The names of the entities with anything of their own due by ``now``, as
        :meth:`housekeeping_due` asks (a retry subqueue's due messages make it due), in
        order: one read for all."""

    # Sending ------------------------------------------------------------------------------
    @abstractmethod
    async def insert_messages(
        self, entity_id: int, rows: Sequence[NewMessage], now: float, *, last: bool = False
    ) -> list[int]:
        """Insert messages (counted as sent); returns their sequence numbers in order.
        ``last`` as in :meth:`lock_ready` (a send that neither forwards nor dead-letters)."""

    @abstractmethod
    async def seen_message_ids(
        self, entity_id: int, message_ids: Sequence[str], now: float
    ) -> set[str]:
        """Which of ``message_ids`` were sent to the entity inside their detection window."""

    @abstractmethod
    async def remember_message_ids(
        self, entity_id: int, message_ids: Sequence[str], expires_at: float
    ) -> None: ...

    @abstractmethod
    async def forget_message_ids(self, now: float) -> int:
        """Prune duplicate-detection ids whose window has passed."""

    # Receiving ----------------------------------------------------------------------------
    @abstractmethod
    async def lock_ready(
        self,
        entity_id: int,
        name: str,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        session_id: str | None = None,
        *,
        last: bool = False,
    ) -> list[ReceivedMessage]:
        """Lock up to ``limit`` messages in state ``ready`` (``active``, or ``dead_lettered``
        in a dead-letter queue), oldest first: ``delivery_count += 1``. With ``session_id``,
        only that session's messages.

        ``last`` says the caller runs nothing more in this transaction: a store whose commit
        costs a round trip may commit with this statement (a receive's last step)."""

    @abstractmethod
    async def take_ready(
        self, entity_id: int, name: str, ready: MessageState, limit: int
    ) -> list[ReceivedMessage]:
        """Remove up to ``limit`` ready messages as completed (receive-and-delete)."""

    @abstractmethod
    async def lock_deferred(
        self, entity_id: int, name: str, seqs: Sequence[int], token: str, locked_until: float
    ) -> list[ReceivedMessage]:
        """Lock the deferred messages with these sequence numbers."""

    @abstractmethod
    async def peek(
        self, entity_id: int, name: str, from_seq: int, limit: int, where: MessageFilter
    ) -> list[ReceivedMessage]:
        """Held messages from ``from_seq`` on that match ``where``, without locking or
        counting."""

    @abstractmethod
    async def seq_span(self, entity_id: int) -> tuple[int, int, int]:
        """(count, lowest, highest) sequence number of the held messages; (0, 0, -1) if none."""

    @abstractmethod
    async def message(self, entity_id: int, name: str, seq: int) -> ReceivedMessage | None: ...

    @abstractmethod
    async def messages(
        self, entity_id: int, name: str, seqs: Sequence[int]
    ) -> list[ReceivedMessage]:
        """Those of ``seqs`` the entity holds, ascending: one query for a batch."""

    @abstractmethod
    async def still_stored(self, seqs: Sequence[int]) -> set[int]:
        """Those of ``seqs`` any entity still holds (in any state): the others were
        completed or dropped (a message keeps its sequence number when it moves)."""

    @abstractmethod
    async def locked(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[LockInfo]:
        """Those of ``seqs`` locked under ``token`` with a lock still valid at ``now``."""

    @abstractmethod
    async def expired_locks(self, entity_id: int, now: float) -> list[LockInfo]: ...

    @abstractmethod
    async def expired_messages(self, entity_id: int, now: float) -> list[int]:
        """Held, unlocked messages whose time to live has passed."""

    @abstractmethod
    async def promote_scheduled(self, entity_id: int, now: float) -> int:
        """Make scheduled messages whose time has come active."""

    @abstractmethod
    async def due_scheduled(self, entity_id: int, now: float) -> list[int]:
        """Scheduled messages whose ``visible_at`` has come, ascending (the retry subqueue
        hands them back to their queue)."""

    # Moves between entities, the rollback counter ----------------------------------------
    @abstractmethod
    async def move(
        self,
        entity_id: int,
        seqs: Sequence[int],
        destination_id: int,
        state: MessageState | None,
        visible_at: float | None,
        move_count: int = 0,
        hop_count: int = 0,
    ) -> list[int]:
        """Move unlocked held messages to ``destination_id``, keeping their sequence numbers and
        fields; ``state`` and ``visible_at`` replace theirs unless ``None``, ``move_count`` and
        ``hop_count`` are added to theirs. Counted as moved out / moved in. Returns the
        sequence numbers moved, ascending."""

    @abstractmethod
    async def add_rollbacks(self, entity_id: int, count: int) -> int:
        """Add ``count`` to the entity's consecutive rollbacks; returns the new total."""

    @abstractmethod
    async def reset_rollbacks(self, entity_id: int) -> None:
        """A completion ends the run of rollbacks."""

    # Sessions -----------------------------------------------------------------------------
    @abstractmethod
    async def lock_session(
        self, entity_id: int, session_id: str | None, token: str, locked_until: float, now: float
    ) -> str | None:
        """Lock session ``session_id`` (creating its record) unless another token holds it
        validly; with ``None``, the oldest session with a message in state ``active`` that
        nobody holds. Returns the session locked, or ``None``."""

    @abstractmethod
    async def session(self, entity_id: int, session_id: str) -> SessionRecord | None: ...

    @abstractmethod
    async def renew_session(
        self, entity_id: int, session_id: str, token: str, now: float, locked_until: float
    ) -> int:
        """Extend a validly held session lock and the message locks taken under it."""

    @abstractmethod
    async def set_session_state(
        self, entity_id: int, session_id: str, token: str, now: float, state: bytes | None
    ) -> int:
        """Store the session's state if ``token`` validly holds it; returns rows changed."""

    @abstractmethod
    async def session_ids(self, entity_id: int, state_updated_after: float | None) -> list[str]:
        """The sessions with a message held (not dead-lettered) or a state kept, by id; with
        ``state_updated_after``, those whose state was set after that time."""

    @abstractmethod
    async def release_session(self, entity_id: int, session_id: str, token: str) -> int:
        """Give up the session lock (its locked messages keep their locks until they end)."""

    @abstractmethod
    async def session_locks(
        self, entity_id: int, session_id: str, token: str, now: float
    ) -> list[int]:
        """The session's messages validly locked under ``token``, ascending."""

    @abstractmethod
    async def unlock_session(
        self, entity_id: int, session_id: str, ready: MessageState
    ) -> list[int]:
        """The session's locked messages (under any lock) back to ``ready``, their locks
        gone and no delivery taken back; returns their sequence numbers, ascending."""

    # Leases -------------------------------------------------------------------------------
    @abstractmethod
    async def lock_lease(
        self,
        entity_id: int,
        name: str,
        consumer: str,
        number: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        now: float,
    ) -> Lease | None:
        """Lock up to ``limit`` of the oldest ready messages under ``token`` as lease
        ``number`` of ``consumer``, and record the lease (``None``: nothing ready). Each
        message counts a delivery, as :meth:`lock_ready`; a store may lock a lease's fresh
        messages by range rather than row by row, as long as every other method then reads
        and settles them as locked under ``token`` until ``locked_until``."""

    @abstractmethod
    async def renew_lease(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, locked_until: float
    ) -> int:
        """Extend to ``locked_until`` the locks the lease with ``token`` still validly holds
        in ``[lo, hi]``; returns how many."""

    @abstractmethod
    async def revive_lease(
        self, entity_id: int, token: str, lo: int, hi: int, locked_until: float
    ) -> int:
        """Extend to ``locked_until`` the locks the lease with ``token`` holds in ``[lo, hi]``,
        those that ran out included while nothing reclaimed them (:meth:`expired_locks` and
        :meth:`close_expired_leases` not yet run since); returns how many."""

    @abstractmethod
    async def close_expired_leases(self, entity_id: int, now: float) -> None:
        """Called once the messages of :meth:`expired_locks` have been abandoned or poisoned:
        the leases whose locks ran out hold nothing any more."""

    @abstractmethod
    async def lease(
        self, entity_id: int, name: str, consumer: str, number: int | None
    ) -> Lease | None:
        """The consumer's lease ``number``, or its latest with ``None``."""

    @abstractmethod
    async def plan_lease(self, entity_id: int, consumer: str, number: int) -> int:
        """Count one more planning of the lease's batch; returns the count (0: no lease)."""

    @abstractmethod
    async def lease_plans(self, entity_id: int, consumer: str, number: int) -> int:
        """How many times the lease's batch was planned (0: no lease, or reset)."""

    @abstractmethod
    async def reset_lease_plans(self, entity_id: int, consumer: str, number: int) -> None:
        """Set the lease's count of plannings back to zero."""

    @abstractmethod
    async def finish_lease(self, entity_id: int, consumer: str, number: int, now: float) -> None:
        """Record that the lease was completed (``completed_at``)."""

    @abstractmethod
    async def delete_leases(self, entity_id: int, consumer: str, before: int) -> None:
        """Forget the consumer's leases numbered below ``before`` (they are settled)."""

    @abstractmethod
    async def lease_seqs(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, first_delivery: bool = False
    ) -> list[int]:
        """Sequence numbers in ``[lo, hi]`` still validly locked under ``token``, ascending;
        with ``first_delivery``, only those delivered for the first time."""

    @abstractmethod
    async def complete_span(self, entity_id: int, token: str, lo: int, hi: int, now: float) -> int:
        """:meth:`complete` every message in ``[lo, hi]`` validly locked under ``token`` (a
        lease's bulk completion, without listing them); returns how many."""

    @abstractmethod
    async def lease_rows(
        self, entity_id: int, token: str, lo: int, hi: int, now: float
    ) -> list[tuple[Any, ...]]:
        """The messages in ``[lo, hi]`` validly locked under ``token`` as tuples of
        :data:`LEASE_COLUMNS`, ascending: the hot read path of Spark executors."""

    @abstractmethod
    async def retake(
        self, entity_id: int, token: str, seqs: Sequence[int], ready: MessageState
    ) -> list[tuple[Any, ...]]:
        """Lock those of ``seqs`` that are ``ready`` under the lease with ``token``, until its
        lock time, each counting a delivery (the lease's consumer taking back messages it
        has just abandoned); returns them as :data:`LEASE_COLUMNS`, ascending."""

    # Settling -----------------------------------------------------------------------------
    @abstractmethod
    async def complete(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[int]:
        """Complete validly locked messages; returns the sequence numbers completed."""

    @abstractmethod
    async def abandon(
        self,
        entity_id: int,
        seqs: Sequence[int],
        ready: MessageState,
        failures: Sequence[dict[str, Any] | None],
        lock_expired: bool,
    ) -> int:
        """Locked → ``ready`` (an abandon): ``abort_count += 1``, and each message's own
        failure (``failures[i]`` for ``seqs[i]``; ``None``: none) appended, in one statement."""

    @abstractmethod
    async def reschedule(self, entity_id: int, seqs: Sequence[int], visible_at: float) -> int:
        """Active → scheduled until ``visible_at`` (a redelivery after a delay); returns how
        many."""

    @abstractmethod
    async def release(
        self,
        entity_id: int,
        token: str,
        lo: int,
        hi: int,
        seqs: Sequence[int] | None,
        ready: MessageState,
        now: float,
    ) -> list[int]:
        """Locked → ``ready`` as if never delivered: ``delivery_count -= 1``, no abort, no
        failure. Only messages in ``[lo, hi]`` (and in ``seqs``, if given) validly locked
        under ``token``; returns their sequence numbers."""

    @abstractmethod
    async def defer(self, entity_id: int, token: str, seqs: Sequence[int], now: float) -> list[int]:
        """Locked → ``deferred``, those of ``seqs`` validly held under ``token`` (locked, or
        by its cover); returns their sequence numbers."""

    @abstractmethod
    async def renew(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float, locked_until: float
    ) -> int: ...

    async def dead_letter(
        self,
        entity_id: int,
        seqs: Sequence[int],
        destination_id: int,
        reason: str,
        description: str | None,
        source: str,
        failure: dict[str, Any] | None,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        """:meth:`dead_letter_each` of messages that share one reason, description and
        failure (the broker's own reasons: expiry, poisoning, transfers)."""
        letters = [Letter(seq, reason, description, failure) for seq in seqs]
        return await self.dead_letter_each(
            entity_id, letters, destination_id, source, now, lock_token
        )

    @abstractmethod
    async def dead_letter_each(
        self,
        entity_id: int,
        letters: Sequence[Letter],
        destination_id: int,
        source: str,
        now: float,
        lock_token: str | None = None,
    ) -> list[int]:
        """Move held messages into the dead-letter queue ``destination_id``, each with its own
        reason, description and failure, in one statement; with ``lock_token``, only those
        validly locked under it. Each keeps its ``delivery_count`` as
        ``dead_lettered_deliveries``. Returns the sequence numbers moved, ascending."""

    @abstractmethod
    async def count_poisoned(self, entity_id: int, count: int) -> None:
        """Add ``count`` poison events (messages the retry policy gave up on) to the ledger."""

    @abstractmethod
    async def drop(self, entity_id: int, seqs: Sequence[int]) -> int:
        """Remove held messages, counted as dropped."""

    @abstractmethod
    async def resubmit(
        self,
        entity_id: int,
        seqs: Sequence[int],
        destination_id: int,
        now: float,
        expires_at: float | None,
    ) -> int:
        """Move unlocked messages to ``destination_id`` under new sequence numbers, as if sent at
        ``now`` (expiring at ``expires_at``), with a fresh delivery count and no dead-letter
        fields; failure history is kept."""

    # Dead-letter analysis and tasks ------------------------------------------------------
    @abstractmethod
    async def dead_letter_groups(
        self, entity_id: int, by: str, aggregated: bool = True
    ) -> list[DeadLetterGroup]:
        """Group held messages by ``reason``, ``subject`` or ``fingerprint``: from the kept
        aggregates of a dead-letter queue (``aggregated``), or counted from the messages of
        any other entity."""

    @abstractmethod
    async def dead_letter_causes(
        self, entity_id: int, aggregated: bool = True
    ) -> list[DeadLetterCause]:
        """The held messages by reason and by the type of their last failure: what a reason
        such as ``MaxDeliveryCountExceeded`` hides (``aggregated`` as for the groups)."""

    @abstractmethod
    async def fingerprint_labels(self, entity_id: int) -> dict[str, tuple[str | None, str | None]]:
        """Every fingerprint the dead-letter queue ``entity_id`` has held, with the error
        type and description of its first dead letter, held or not any more."""

    @abstractmethod
    async def dead_letter_drift(self) -> set[int]:
        """The dead-letter queues whose kept aggregates differ from a recount (the audit)."""

    # History (poisonq/store/history.py) ---------------------------------------------------
    @abstractmethod
    async def dead_letter_history(
        self, span: int, since: float, by: str | None, entity_id: int | None
    ) -> list[DeadLetterCount]:
        """Dead-letterings in the buckets of ``span`` seconds from ``since`` on, grouped by
        ``reason``, ``subject`` or ``fingerprint`` (by nothing with ``None``: the key is
        ``None``), of one entity or of every one."""

    @abstractmethod
    async def depth_history(
        self, span: int, since: float, entity_id: int | None
    ) -> list[DepthChange]:
        """The buckets of ``span`` seconds from ``since`` on in which depths changed, of one
        entity or of every one, oldest first."""

    @abstractmethod
    async def select(
        self,
        entity_id: int,
        where: MessageFilter,
        after_seq: int,
        limit: int,
        newest_first: bool = False,
    ) -> list[int]:
        """Sequence numbers of unlocked held messages matching ``where`` after ``after_seq``:
        the first ``limit`` in ascending order, or with ``newest_first`` the last ``limit``
        in descending order."""

    @abstractmethod
    async def count_matching(
        self, entity_id: int, where: MessageFilter, aggregated: bool = False
    ) -> int:
        """How many unlocked held messages match ``where``; with ``aggregated`` (a dead-letter
        queue), a filter by reason, subject or fingerprint alone is counted from the kept
        aggregates, less the locked messages."""

    @abstractmethod
    async def insert_task(
        self,
        kind: str,
        entity_id: int,
        spec: dict[str, Any],
        total: int,
        now: float,
        started_by: str | None,
    ) -> int: ...

    @abstractmethod
    async def task(self, task_id: int) -> TaskRecord | None: ...

    @abstractmethod
    async def tasks(
        self, entity_id: int | None, before_id: int | None, limit: int, running: bool = False
    ) -> list[TaskRecord]:
        """Tasks newest first (of one entity, or all), with an id below ``before_id`` if
        given; with ``running`` only those still marked running."""

    @abstractmethod
    async def update_task(
        self,
        task_id: int,
        done: int,
        status: str,
        error: str | None,
        now: float,
        cancelled_by: str | None = None,
    ) -> None: ...

    # Pipeline timelines ------------------------------------------------------------------
    @abstractmethod
    async def dead_lettered_between(
        self, entity_id: int, lo: int, hi: int, since: float, until: float
    ) -> dict[str, int]:
        """How many of the messages in ``[lo, hi]`` that the dead-letter queue ``entity_id``
        holds were dead-lettered between ``since`` and ``until``, by reason (``""``: none)."""

    @abstractmethod
    async def record_batch(self, entity_id: int, batch: PipelineBatch, keep: int) -> None:
        """Record a batch of ``batch.consumer`` on the queue ``entity_id`` (a lease replayed
        replaces its record) and forget the consumer's batches of leases numbered ``keep``
        or more below it."""

    @abstractmethod
    async def forget_pipeline(self, entity_id: int, consumer: str) -> None:
        """Delete every recorded batch of ``consumer`` on the queue ``entity_id``."""

    @abstractmethod
    async def pipeline_batches(self, entity_id: int, consumer: str) -> list[PipelineBatch]:
        """The recorded batches of ``consumer`` on the queue ``entity_id``, by lease."""

    @abstractmethod
    async def pipelines(self) -> list[PipelineSummary]:
        """Every consumer of a queue with recorded batches, by queue and consumer."""


UNSTORABLE = (UnicodeEncodeError, OverflowError)
"""What a driver raises, before anything reaches the database, for a value it cannot
represent: text that is not valid Unicode (a lone surrogate) or an integer beyond 64 bits."""


def unstorable(exc: UnicodeEncodeError | OverflowError) -> InvalidOptionError:
    """The caller's error for a value the store cannot hold (see :data:`UNSTORABLE`); the
    transaction was rolled back, so nothing of the call was written."""
    if isinstance(exc, UnicodeEncodeError):
        bad = exc.object[exc.start : exc.end]
        return InvalidOptionError(f"text must be valid Unicode, not with {bad!r}")
    return InvalidOptionError(f"a number is out of the store's 64-bit range ({exc})")


def pending_migrations(kind: str, applied: Collection[int], store: str) -> list[tuple[int, str]]:
    """The numbered scripts of ``poisonq/store/migrations/<kind>/`` that the store has not
    ``applied``, as (version, SQL) in order. The store lists every version it applied, not
    only its latest: scripts written side by side on two branches (8 and 9) each apply once,
    whichever a store saw first, so a script below the latest one applied is still run (their
    scripts must not depend on each other). A store at a version newer than this poisonq
    knows is refused (:class:`SchemaVersionError`), never downgraded."""
    folder = resources.files("poisonq.store") / "migrations" / kind
    scripts = sorted(
        (int(p.name.split("_")[0]), p) for p in folder.iterdir() if p.name.endswith(".sql")
    )
    latest = scripts[-1][0]
    if applied and max(applied) > latest:
        raise SchemaVersionError(
            f"{store} has schema version {max(applied)}; this poisonq knows up to {latest}"
        )
    return [(version, p.read_text()) for version, p in scripts if version not in applied]


class Store(ABC):
    """A connection to one store. Thread-safe: SQLite serializes the transactions of a store,
    PostgreSQL runs them side by side on pooled connections."""

    url: str
    closed = False
    history: HistoryKeeper  # its clock stamps the history; set by each store's __init__

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """A write transaction: commits on exit, rolls back on error. Raises
        :class:`BrokerClosedError` once the store is closed."""

    def reading(self) -> AbstractAsyncContextManager[Transaction]:
        """A transaction for a reader that writes nothing: SQLite begins it deferred, so it
        neither takes nor waits for the write lock; PostgreSQL's transactions are all
        alike."""
        return self.transaction()

    def check_open(self) -> None:
        if self.closed:
            raise BrokerClosedError(self.url)

    #: Whether the store has a clock of its own that its clients share (a database server
    #: they reach from several hosts): then :meth:`server_offset` reads it and a broker's
    #: default clock follows it. A store on one machine (SQLite) has none: its clock is the
    #: local one.
    has_server_clock: ClassVar[bool] = False

    def server_offset(self, local: Callable[[], float]) -> float:
        """The store's clock less ``local()``, in seconds (see :attr:`has_server_clock`)."""
        raise InvalidOperationError(f"{type(self).__name__} has no clock of its own")

    @abstractmethod
    def change_marker(self) -> object:
        """A value that changes whenever a transaction of any process that made a message
        receivable commits (:meth:`poisonq.store.ledger.LedgerCounts._made_receivable`;
        SQLite's changes at every commit of a write)."""

    @abstractmethod
    def wait_for_change(self, marker: object, timeout: float) -> None:
        """Block until the change marker differs from ``marker``, or ``timeout`` passes."""

    @abstractmethod
    def close(self) -> None:
        """Close the connections; later calls raise :class:`BrokerClosedError`. Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
