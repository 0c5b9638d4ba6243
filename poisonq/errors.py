"""The error hierarchy: every error poisonq raises derives from :class:`PoisonqError`.

Errors carry the fields an operator or a caller needs to act (entity name, sequence numbers,
limits) instead of only a formatted message. Driver errors (sqlite3, psycopg) are wrapped at the
store boundary as :class:`StoreError` with the original chained as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Sequence


class PoisonqError(Exception):
    """Base class of every error raised by poisonq."""


class InvalidNameError(PoisonqError, ValueError):
    """An entity name or address does not follow the naming rules."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"invalid entity name {name!r}: {why}")
        self.name = name


class InvalidOptionError(PoisonqError, ValueError):
    """An option, policy or argument value is out of range or of the wrong type."""


class EntityNotFoundError(PoisonqError, LookupError):
    """The named queue (or subqueue) does not exist; ``close`` holds the existing names
    nearest to it, best first (a typo's likely meaning)."""

    def __init__(self, name: str, close: Sequence[str] = ()) -> None:
        guess = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        super().__init__(f"no queue {name!r}{guess}")
        self.name = name
        self.close = list(close)


class EntityExistsError(PoisonqError):
    """An entity with this name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"entity {name!r} already exists")
        self.name = name


class EntityDisabledError(PoisonqError):
    """The entity's status forbids this operation (sending or receiving)."""

    def __init__(self, name: str, status: str, operation: str) -> None:
        super().__init__(f"cannot {operation} on {name!r}: entity is {status}")
        self.name = name
        self.status = status
        self.operation = operation


class PoisonMessageError(EntityDisabledError):
    """The entity faulted on a poison message (``receive_error_handling = fault``): it stays
    ``receive_disabled`` until an operator moves, drops or resubmits message
    ``sequence_number`` and enables the entity again."""

    def __init__(self, name: str, sequence_number: int) -> None:
        PoisonqError.__init__(
            self,
            f"cannot receive on {name!r}: it faulted on poison message {sequence_number}; "
            f"move, drop or resubmit message {sequence_number}, then enable the queue",
        )
        self.name = name
        self.status = "receive_disabled"
        self.operation = "receive"
        self.sequence_number = sequence_number


class SessionLockLostError(PoisonqError):
    """The session lock expired, was never held, or is held by another receiver."""

    def __init__(self, name: str, session_id: str, ran_out: bool = False) -> None:
        if ran_out:
            why = (
                f"the lock on session {session_id!r} of {name!r} ran out (receiving does not"
                " extend it: renew_session_lock() or an AutoLockRenewer does)"
            )
        else:
            why = f"lock lost or not held on session {session_id!r} of {name!r}"
        super().__init__(why)
        self.name = name
        self.session_id = session_id


class SessionCannotBeLockedError(PoisonqError):
    """Another receiver holds the session under a valid lock."""

    def __init__(self, name: str, session_id: str) -> None:
        super().__init__(f"session {session_id!r} of {name!r} is locked by another receiver")
        self.name = name
        self.session_id = session_id


class FilterError(InvalidOptionError):
    """A subscription filter's text does not parse; ``position`` is where it went wrong."""

    def __init__(self, text: str, position: int, why: str) -> None:
        super().__init__(f"invalid filter {text!r} at {position}: {why}")
        self.text = text
        self.position = position


class MessageTooLargeError(PoisonqError):
    """A message is larger than the entity's ``max_message_size``; nothing was sent."""

    def __init__(self, message_id: str, size: int, limit: int) -> None:
        super().__init__(f"message {message_id!r} is {size} bytes; the limit is {limit} bytes")
        self.message_id = message_id
        self.size = size
        self.limit = limit


class QuotaExceededError(PoisonqError):
    """Sending would make the entity larger than its ``max_size``; nothing was sent."""

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(f"entity {name!r} would hold {size} bytes; its max_size is {limit} bytes")
        self.name = name
        self.size = size
        self.limit = limit


class MessageLockLostError(PoisonqError):
    """The lock on these messages expired or was never held; nothing was changed."""

    def __init__(self, sequence_numbers: Sequence[int]) -> None:
        numbers = ", ".join(str(n) for n in sequence_numbers[:10])
        more = f" and {len(sequence_numbers) - 10} more" if len(sequence_numbers) > 10 else ""
        super().__init__(f"lock lost or expired for message(s) {numbers}{more}")
        self.sequence_numbers = list(sequence_numbers)


class MessageAlreadySettledError(MessageLockLostError):
    """These messages were settled (completed, abandoned, deferred, dead-lettered) through
    this client already: refused before any call to the store, by the mark the settlement
    left on each message object, as azure-servicebus' ``MessageAlreadySettled``; nothing was
    changed. A :class:`MessageLockLostError`, since the receiver holds their locks no more
    (code that caught a second settlement as a lost lock still catches it)."""

    def __init__(self, sequence_numbers: Sequence[int]) -> None:
        numbers = ", ".join(str(n) for n in sequence_numbers[:10])
        more = f" and {len(sequence_numbers) - 10} more" if len(sequence_numbers) > 10 else ""
        PoisonqError.__init__(
            self,
            f"message(s) {numbers}{more} settled already through this client: a settled"
            " message cannot be settled again, nor its lock renewed",
        )
        self.sequence_numbers = list(sequence_numbers)


class MessageNotFoundError(PoisonqError, LookupError):
    """No message with this sequence number is held by the entity in the expected state."""

    def __init__(self, entity: str, sequence_number: int) -> None:
        super().__init__(f"no such message {sequence_number} in {entity!r}")
        self.entity = entity
        self.sequence_number = sequence_number


class InvalidOperationError(PoisonqError):
    """The operation is not allowed here (for example dead-lettering a dead-lettered message)."""


class PipelineLeaseHeldError(InvalidOperationError):
    """A pipeline consumer to forget still holds messages under a live lease: it looks
    alive (a driver mid-batch), and forgetting it would leave its messages held by a
    consumer no one remembers. Stop it first, or force: its messages go back to the queue."""

    def __init__(self, consumer: str, queue: str, lease: int, held: int) -> None:
        super().__init__(
            f"consumer {consumer!r} on {queue!r} holds {held} message(s) under lease {lease},"
            " whose lock is live: stop its pipeline first, or force (its messages go back"
            " to the queue, no delivery counted)"
        )
        self.consumer = consumer
        self.queue = queue
        self.lease = lease
        self.held = held


class TaskNotFoundError(PoisonqError, LookupError):
    """No resubmit or purge task with this id (a task is deleted with its queue)."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"no such task {task_id} (a task is deleted with its queue)")
        self.task_id = task_id


class NothingSelectedError(PoisonqError, LookupError):
    """A resubmit or purge whose filters select no dead letter: nothing is started, and the
    message says what there is instead, so that the next try can be right."""

    def __init__(self, queue: str, there: str) -> None:
        super().__init__(f"no dead letter of {queue!r} matches: {there}")
        self.queue = queue


class PipelineNotFoundError(PoisonqError, LookupError):
    """No pipeline batch is recorded for this consumer (on this queue); ``close`` holds the
    consumers with a timeline whose names are nearest, best first."""

    def __init__(self, consumer: str, queue: str | None = None, close: Sequence[str] = ()) -> None:
        where = f" on queue {queue!r}" if queue is not None else ""
        guess = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        super().__init__(f"no pipeline batches recorded for consumer {consumer!r}{where}{guess}")
        self.consumer = consumer
        self.queue = queue
        self.close = list(close)


class TaskRunningError(InvalidOperationError):
    """A resubmit or purge is already running on this queue's dead-letter queue: one task at
    a time per queue (as SQS allows one move task per queue), so two never take the same
    messages. ``task_id`` is the running one's, when known."""

    def __init__(self, queue: str, task_id: int | None, started_by: str | None = None) -> None:
        which = f"task {task_id}" if task_id is not None else "a task"
        by = f" (started by {started_by})" if started_by else ""
        cancel = f" (poisonq task cancel {task_id})" if task_id is not None else ""
        super().__init__(
            f"{which} is already resubmitting or purging the messages of {queue!r}{by}:"
            f" wait for it to finish or cancel it{cancel}, then start again"
        )
        self.queue = queue
        self.task_id = task_id
        self.started_by = started_by


class StoreError(PoisonqError):
    """The store failed (disk, lock timeout, corrupt file); the driver error is the cause."""


class SchemaVersionError(StoreError):
    """The store was written by a newer poisonq than this one."""


class StoreNotFoundError(StoreError):
    """There is no store at ``location`` and the caller asked not to create one
    (``poisonq.connect(url, create=False)``)."""

    def __init__(self, location: str) -> None:
        super().__init__(f"no poisonq store at {location}")
        self.location = location


class StoreUnavailableError(StoreError):
    """The store could not be reached, restarted under the operation, or stayed busy past
    its timeout: nothing was committed, or (the connection lost while committing) perhaps
    everything was. The client retries such operations (``retry_total``) before raising."""


class StoreConflictError(StoreUnavailableError):
    """The store gave this transaction up for another that it conflicted with (PostgreSQL
    chose it as a deadlock's victim, or could not serialize it): nothing was committed, and
    the store is reachable. Retried as an outage is, without being logged as one."""


class StoreFullError(StoreError):
    """The store has no room left (its disk, or a size limit of the database): nothing of the
    operation was written. Not retried, since waiting rarely frees space: free some (purge a
    dead-letter queue, grow the disk), and what failed can be done again."""


class BrokerClosedError(PoisonqError):
    """The broker (and its store) was closed; open a new one with :func:`poisonq.connect`."""

    def __init__(self, url: str) -> None:
        super().__init__(f"the broker on {url} is closed")
        self.url = url


class UnsupportedPySparkError(PoisonqError, ImportError):
    """The PySpark installed is outside the range poisonq's Spark features work on
    (:mod:`poisonq.spark.versions`); an ``ImportError``, so that PySpark's lookup of
    ``pyspark_*`` data sources passes over poisonq instead of failing."""

    def __init__(self, version: str, supported: str) -> None:
        super().__init__(
            f"poisonq's Spark features need PySpark {supported}; this is PySpark {version}"
        )
        self.version = version
        self.supported = supported


class BatchFunctionError(PoisonqError, TypeError):
    """A ``map_batches`` function returned what no batch may get back: errors of another
    count than its messages, rows that cannot be tied to their messages, a value of another
    type. It is the function's defect, whatever its messages hold, so it is never traced to
    a message: the pipeline stops and gives the batch back (``function`` names it)."""

    def __init__(self, function: str, problem: str) -> None:
        super().__init__(f"map_batches function {function} {problem}")
        self.function = function


class PermanentError(Exception):
    """Raised by a handler or transform to say a message can never succeed.

    The processor dead-letters such a message at once (fail fast) with the exception's type
    as reason, instead of retrying it. It is the user's exception, so it does not derive from
    :class:`PoisonqError`.
    """
