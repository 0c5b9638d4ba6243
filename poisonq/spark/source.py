"""The ``poisonq`` Spark data source: batch read, streaming read and batch write.

Contracts of PySpark's Python Data Source API that shape this module: the data source and
its readers are pickled to other Python processes (planning, ``read`` and the writer's
commit each run in a different one), so they hold only the parsed options and every method
opens the store itself; nothing may live in memory between calls. A streaming micro-batch is
a *lease*: messages locked under one token and recorded in the store under the consumer's
name and a number, and the offset is that number. So a query restarted from its checkpoint
finds the same lease and reads the same messages again, its lock renewed, or revived if it
ran out while the query was down and nothing received from the queue since (so a batch
replayed after a kill is the batch the killed run had: same batch id, same lease, same
messages less those it settled). Spark calls ``commit(end)`` one batch
late and never for the last batch, but it runs micro-batches in order, so a call to
``latestOffset(start)`` proves the batch ending at ``start`` committed: both complete that
lease. A lease whose query died and was not restarted is never completed; its locks run out
and its messages are delivered again. A lease planned a second time is a replay after a
failure, and is narrowed (:mod:`poisonq.spark.narrowing`) so that a poison row cannot keep
failing its whole batch, unless a handler that isolates its own failures took the batch up
(:mod:`poisonq.spark.streaming` resets the count): then the replay is a restart's, kept whole.

The schema tags the ``sequence_number`` column with where the rows come from (:class:`StoreTag`):
column metadata reaches the DataFrame a ``foreachBatch`` function gets, so the streaming helper
(:mod:`poisonq.spark.streaming`) finds the batch's lease from the DataFrame alone.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructField, StructType

import poisonq
from poisonq.errors import InvalidOptionError
from poisonq.model import Lease, Message
from poisonq.names import parse_address
from poisonq.options import MAX_LOCK_DURATION
from poisonq.spark.connect import is_connect
from poisonq.spark.narrowing import Chunks, after_replay, isolate_suspect, narrow
from poisonq.spark.schema import ARROW_SCHEMA, lease_batch, message_batch
from poisonq.spark.stores import open_existing

T = TypeVar("T", int, float)
ARROW_BATCH_ROWS = 10_000
ROWS_PER_PARTITION = 50_000
MAX_PARTITIONS = 16
IDLE_RECHECK = 1.0  # seconds an idle stream trusts an unchanged store
WRITABLE_COLUMNS = frozenset(
    {
        "body",
        "message_id",
        "content_type",
        "subject",
        "properties",
        "session_id",
        "correlation_id",
        "reply_to",
        "time_to_live",
        "scheduled_enqueue_time",
    }
)


# Every option the data source takes, as docs/spark.md lists them; ``path`` is what
# ``.load(NAME)`` passes.
OPTIONS = (
    "url",
    "queue",
    "entity",
    "path",
    "subqueue",
    "consumer",
    "maxMessagesPerBatch",
    "lockDuration",
    "numPartitions",
    "lease",
    "minSequence",
    "maxSequence",
)


@dataclass(frozen=True)
class SourceOptions:
    """The data source's options, checked once on the driver (picklable, nothing open)."""

    url: str
    address: str
    consumer: str = "spark"
    max_messages_per_batch: int = 10_000
    lock_duration: float | None = None
    partitions: int | None = None
    lease: int | None = None
    min_sequence: int | None = None
    max_sequence: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check ``options`` (names in any case, as Spark's are) and convert them. A name
        Spark's other sources take (``maxMessagesPerTrigger``) or a typo would otherwise be
        ignored silently, and a missing ``url`` would open (and create) ``./poisonq.db``."""
        given = {key.lower(): value for key, value in options.items()}
        unknown = sorted(set(given) - {name.lower() for name in OPTIONS})
        if unknown:
            raise InvalidOptionError(
                f"unknown option(s) of the poisonq data source: {', '.join(unknown)};"
                f" it takes {', '.join(OPTIONS)}"
            )
        get = given.get
        url = get("url")
        if not url:
            raise InvalidOptionError(
                'the poisonq data source needs .option("url", URL), the store to read'
                " (sqlite:////absolute/path.db or postgresql://...)"
            )
        queue = _queue(get("queue"), get("entity"), get("path"))
        address = str(parse_address(queue, get("subqueue")))
        return cls(
            url=absolute_url(url),
            address=address,
            consumer=get("consumer") or "spark",
            max_messages_per_batch=_int(get, "maxMessagesPerBatch") or 10_000,
            lock_duration=_seconds(get, "lockDuration"),
            partitions=_int(get, "numPartitions"),
            lease=_int(get, "lease"),
            min_sequence=_int(get, "minSequence"),
            max_sequence=_int(get, "maxSequence"),
        )

    def connect(self) -> poisonq.Broker:
        return open_existing(self.url)


def _queue(*names: str | None) -> str:
    """The queue of the ``queue`` or ``entity`` option, or of ``.load(NAME)`` (``path``)."""
    given = {name for name in names if name}
    if not given:
        raise InvalidOptionError(
            'the poisonq data source needs a queue: .option("queue", NAME) or .load(NAME)'
        )
    if len(given) > 1:
        raise InvalidOptionError(
            f"the queue is named twice, differently: {', '.join(sorted(given))}"
            " (give one of the queue option, the entity option or .load(NAME))"
        )
    return given.pop()


def _int(get: Any, name: str) -> int | None:
    return _parsed(get, name, int, "an integer", lambda v: v >= 1, "at least 1")


def _seconds(get: Any, name: str) -> float | None:
    bounds = f"in (0, {MAX_LOCK_DURATION:g}]"
    return _parsed(
        get, name, float, "a number of seconds", lambda v: 0 < v <= MAX_LOCK_DURATION, bounds
    )


def _parsed(
    get: Any,
    name: str,
    convert: Callable[[str], T],
    kind: str,
    valid: Callable[[T], bool],
    bounds: str,
) -> T | None:
    """Option ``name`` converted and checked, or None when it is not given."""
    text = get(name.lower())
    if text is None:
        return None
    try:
        value = convert(text)
    except ValueError:
        raise InvalidOptionError(f"option {name} must be {kind}, not {text!r}") from None
    if not valid(value):
        raise InvalidOptionError(f"option {name} must be {bounds}, not {text}")
    return value


def absolute_url(url: str) -> str:
    """Executors may run in another directory: pin a relative SQLite path to this one."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        path, _, query = url[len(prefix) :].partition("?")
        return prefix + os.path.abspath(path) + (f"?{query}" if query else "")
    return url


@dataclass
class SequenceRange(InputPartition):
    """One Spark partition: the messages with sequence numbers in ``[lo, hi]``, of a lease
    (which carries the lock token) or, without one, of the entity as a peek sees it."""

    lo: int
    hi: int
    lease: Lease | None = None


def _split(lo: int, hi: int, count: int, wanted: int | None) -> list[tuple[int, int]]:
    parts = wanted or max(1, min(MAX_PARTITIONS, math.ceil(count / ROWS_PER_PARTITION)))
    width = max(1, math.ceil((hi - lo + 1) / parts))
    return [(start, min(hi, start + width - 1)) for start in range(lo, hi + 1, width)]


def _lease_partitions(lease: Lease, options: SourceOptions) -> list[SequenceRange]:
    lo = max(lease.min_sequence, options.min_sequence or lease.min_sequence)
    hi = min(lease.max_sequence, options.max_sequence or lease.max_sequence)
    return [SequenceRange(a, b, lease) for a, b in _split(lo, hi, lease.count, options.partitions)]


def _read(options: SourceOptions, partition: SequenceRange) -> Iterator[pa.RecordBatch]:
    """Read a partition straight from the store, in Arrow batches."""
    with options.connect() as broker:
        if partition.lease is not None:
            rows = broker.lease_rows(partition.lease, partition.lo, partition.hi)
            for start in range(0, len(rows), ARROW_BATCH_ROWS):
                yield lease_batch(rows[start : start + ARROW_BATCH_ROWS])
            return
        after = partition.lo
        while after <= partition.hi:
            page = broker.peek(options.address, from_sequence=after, max_messages=ARROW_BATCH_ROWS)
            page = [m for m in page if m.sequence_number <= partition.hi]
            if not page:
                return
            yield message_batch(page)
            after = page[-1].sequence_number + 1


class PoisonqDataSource(DataSource):
    """``spark.read / readStream / write .format("poisonq")``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "poisonq"

    def schema(self) -> StructType:
        return tagged_schema(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> StreamReader:
        return StreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> QueueWriter:
        unknown = set(schema.fieldNames()) - WRITABLE_COLUMNS
        if "body" not in schema.fieldNames() or unknown:
            raise InvalidOptionError(
                f"write a DataFrame with a body column and any of {sorted(WRITABLE_COLUMNS)}"
                + (f"; unknown columns {sorted(unknown)}" if unknown else "")
            )
        if overwrite:
            raise InvalidOptionError(
                "a write sends its rows to the queue (mode 'append'); it never replaces what the"
                " queue holds: purge it first if that is meant (poisonq dlq purge, or a purge task)"
            )
        return QueueWriter(SourceOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("poisonq")`` known to ``spark``, unless PySpark's lookup of
    ``pyspark_*`` modules found it already (registering it again would only log a warning
    that it replaced the one found)."""
    if not is_connect(spark) and _found(spark):
        return
    spark.dataSource.register(PoisonqDataSource)


def _found(spark: SparkSession) -> bool:
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return bool(manager.dataSourceExists(PoisonqDataSource.name()))


@dataclass(frozen=True)
class StoreTag:
    """Where a DataFrame's messages come from, in its ``sequence_number`` column's metadata."""

    url: str
    address: str
    consumer: str
    lock_duration: float | None = None


TAG = "poisonq"
SEQUENCE = "sequence_number"
# Planning runs in a Python worker with no Spark session, so not StructType.fromDDL.
_MESSAGE_STRUCT = from_arrow_schema(ARROW_SCHEMA, prefer_timestamp_ntz=False)


def tagged_schema(options: SourceOptions) -> StructType:
    """The message schema (:data:`~poisonq.spark.schema.MESSAGE_SCHEMA_DDL`), its
    ``sequence_number`` tagged with the store, address and consumer of ``options``."""
    where: dict[str, Any] = {
        "url": options.url,
        "address": options.address,
        "consumer": options.consumer,
    }
    if options.lock_duration is not None:
        where["lock_duration"] = options.lock_duration
    tag = {TAG: where}
    return StructType(
        [
            StructField(f.name, f.dataType, f.nullable, tag if f.name == SEQUENCE else None)
            for f in _MESSAGE_STRUCT.fields
        ]
    )


def store_tag(frame: DataFrame) -> StoreTag:
    """Where ``frame``'s messages come from, or :class:`InvalidOptionError` if it is not a
    read of the ``poisonq`` source (or lost its ``sequence_number`` column)."""
    field = next((f for f in frame.schema.fields if f.name == SEQUENCE), None)
    tag = field.metadata.get(TAG) if field is not None else None
    if not isinstance(tag, dict):
        raise InvalidOptionError(
            "this DataFrame is not a read of the poisonq source: it needs the sequence_number"
            ' column of spark.readStream.format("poisonq") (selected or filtered, not'
            " recomputed), whose metadata names the queue and the store"
        )
    return tag_of(tag)


def tag_of(tag: Mapping[str, Any]) -> StoreTag:
    """The :class:`StoreTag` that ``sequence_number``'s metadata holds under :data:`TAG`."""
    seconds = tag.get("lock_duration")
    lock_duration = None if seconds is None else float(seconds)
    return StoreTag(str(tag["url"]), str(tag["address"]), str(tag["consumer"]), lock_duration)


def untagged(frame: DataFrame) -> DataFrame:
    """``frame`` without the tag, which names the store's URL (with any password in it):
    Parquet and Delta keep column metadata in what they write."""
    if SEQUENCE not in frame.columns:
        return frame
    return frame.withMetadata(SEQUENCE, {})


class BatchReader(DataSourceReader):
    """A peek of a queue or subqueue (no locks, no delivery counted), split by sequence
    range; with the ``lease`` option, the messages a lease of ``consumer`` still holds."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[SequenceRange]:
        with self.options.connect() as broker:
            if self.options.lease is not None:
                options = self.options
                lease = broker.lease(options.address, options.consumer, options.lease)
                return [] if lease is None else _lease_partitions(lease, self.options)
            count, lo, hi = broker.sequence_span(self.options.address)
        lo = max(lo, self.options.min_sequence or lo)
        hi = min(hi, self.options.max_sequence or hi)
        if count == 0 or lo > hi:
            return []
        return [SequenceRange(a, b) for a, b in _split(lo, hi, count, self.options.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SequenceRange):  # PySpark's stand-in for "no partitions"
            return iter(())
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Each micro-batch is one lease of at most ``maxMessagesPerBatch`` messages.

    Spark asks for the latest offset on every trigger, data or not: many times a second for
    an idle query. So after finding the queue empty, the planning process keeps its connection
    and looks again only when the store changed (or :data:`IDLE_RECHECK` seconds passed, for
    messages that become receivable without a commit: scheduled ones, expired locks); an idle
    query then costs a read of a counter, not a write transaction. This cache is not state:
    a new process starts without it and simply looks.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._broker: poisonq.Broker | None = None
        self._idle: tuple[int, object, float] | None = None  # (start, marker, when)
        self._until: int | None = None  # trigger availableNow: the last sequence number
        self._after: tuple[int, Chunks] | None = None  # (lease completed, the leases after it)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}  # ``read`` runs elsewhere and needs only the options

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._broker = None
        self._idle = None
        self._until = None
        self._after = None

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: read what the queue holds now, in batches of
        ``maxMessagesPerBatch``, then stop. Messages sent later are left for the next run;
        messages given back to retry during the run come again in it.

        The run's first batch may be the replay of the last run's: its lease is resumed
        before the queue is read, since a read takes back the locks that ran out, and a
        restart later than ``lockDuration`` would otherwise count a delivery for every
        message of the batch before the replay could revive them."""
        options = self.options
        with options.connect() as broker:
            last = broker.lease(options.address, options.consumer)
            if last is not None and last.completed_at is None:
                broker.resume_lease(last, options.lock_duration)
            self._until = broker.sequence_span(options.address)[2]

    def initialOffset(self) -> dict[str, int]:
        return {"lease": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        done = start["lease"]
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._broker is None:
            self._broker = self.options.connect()
        broker = self._broker
        if self._idle is not None:
            since, marker, when = self._idle
            fresh = time.monotonic() - when < IDLE_RECHECK
            if since == done and fresh and broker.change_marker() == marker:
                return start
        if done and (self._after is None or self._after[0] != done):
            self._after = (done, self._complete(broker, done, Chunks.of(start)))
        chunks = self._after[1] if done and self._after is not None else Chunks()
        size = wanted or self.options.max_messages_per_batch
        lease = broker.acquire_lease(
            self.options.address,
            self.options.consumer,
            done + 1,
            min(size, chunks.width or size),
            self.options.lock_duration,
        )
        if lease is not None and self._until is not None and lease.max_sequence > self._until:
            # Sent after an availableNow run began: give it back, no delivery counted.
            broker.release_lease(lease, lo=self._until + 1)
            lease = None if lease.min_sequence > self._until else lease
        if lease is not None:
            self._idle = None
            isolate_suspect(broker, lease)
            return {"lease": lease.number, **chunks.after_one().offset()}
        # Taken after the look: a commit in between shows only at the next recheck.
        self._idle = (done, broker.change_marker(), time.monotonic())
        return start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[SequenceRange]:
        if start == end:
            return []
        with self.options.connect() as broker:
            lease = broker.lease(self.options.address, self.options.consumer, end["lease"])
            if lease is None:
                return []
            # A replay after a kill may come after the lease's lock ran out: its messages
            # are still its own unless something received from the queue since.
            broker.resume_lease(lease, self.options.lock_duration)
            if broker.plan_lease(lease) > 1:
                narrow(broker, lease, self.options.address)
        return _lease_partitions(lease, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        if partition.lease is not None:
            with self.options.connect() as broker:
                broker.resume_lease(partition.lease, self.options.lock_duration)
        return _read(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        if end["lease"]:
            with self.options.connect() as broker:
                self._complete(broker, end["lease"], Chunks.of(end))

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    def _complete(self, broker: poisonq.Broker, number: int, planned: Chunks) -> Chunks:
        """Complete a batch Spark committed; return how the leases after it are sized.

        The lease is resumed first: a batch replayed after a kill that the sink had already
        committed (the file sink skips it) is never read, so nothing renewed its locks while
        the query was down; what nobody took since is still the batch's, and was written.
        A lease its replay narrowed sizes the leases after it (:func:`after_replay`)."""
        lease = broker.lease(self.options.address, self.options.consumer, number)
        if lease is None:
            return planned
        broker.resume_lease(lease, self.options.lock_duration)
        planned = after_replay(broker, lease) or planned
        broker.complete_lease(lease)
        return planned


@dataclass
class Sent(WriterCommitMessage):
    count: int


class QueueWriter(DataSourceWriter):
    """Each partition task sends its rows in one transaction. A task Spark retries sends
    its rows again: give them a ``message_id`` and turn on duplicate detection."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Sent:
        messages = [_message(row.asDict()) for row in iterator]
        if messages:
            with self.options.connect() as broker:
                broker.sender(self.options.address).send(messages)
        return Sent(len(messages))


def _message(row: dict[str, Any]) -> Message:
    # Spark hands timestamps over as naive local datetimes.
    fields: dict[str, Any] = {
        key: value.astimezone(UTC)
        if isinstance(value, datetime) and value.tzinfo is None
        else value
        for key, value in row.items()
        if value is not None
    }
    body = fields.pop("body", None)
    if body is None:
        raise InvalidOptionError("a row to send has no body")
    message = Message(body=bytes(body) if isinstance(body, bytearray) else body)
    return replace(message, **fields)
