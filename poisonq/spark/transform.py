"""The executor side of the pipeline: a data source that reads a lease and transforms it.

Reading the lease and transforming it happen in one Python pass per partition: the rows go
from the store straight into the transform and out as Arrow in the output schema. A plain
read followed by ``mapInArrow`` would move every message from Python to the JVM and back
again, which costs more than the transform. Each pipeline registers its own subclass of
:class:`PipelineSource` that carries the transform, because options can only carry strings.

The failed messages of a partition are settled in one transaction when the partition has
been read: a permanent error dead-letters, any other error or a crash abandons. The messages
that succeeded stay locked under the lease until the driver has written the batch. When the
failures show a defect (:mod:`poisonq.defects`), the task raises :class:`DefectFound`
instead (:mod:`poisonq.spark.settling`), so the job fails with nothing settled and nothing
written, and the driver gives the lease back.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.types import StructType

from poisonq.defects import MIN_FAILURES, find_defect
from poisonq.failures import dead_lettering
from poisonq.model import Lease
from poisonq.spark.batches import BatchTransform
from poisonq.spark.settling import DefectFound, Failure
from poisonq.spark.source import ARROW_BATCH_ROWS, BatchReader, SequenceRange, SourceOptions
from poisonq.spark.stores import open_existing
from poisonq.spark.work import FunctionWork, crashed, function_name, settlement
from poisonq.store.base import LEASE_COLUMNS
from poisonq.worker.guard import Crashed, Failed, Transform, run_inline, run_isolated
from poisonq.worker.lease_rows import OnLeaseRows

log = logging.getLogger(__name__)

_DELIVERY_COUNT = LEASE_COLUMNS.index("delivery_count")
FIRST_CHUNK = 100  # rows of a partition's first chunk: enough to tell a defect (_chunks)
# The most times a message that crashed the worker runs again within its batch; beyond, it
# comes back in a later batch as any abandoned message (a queue whose retry policy never
# poisons would otherwise keep a task rerunning it).
CRASH_RERUNS = 9


@dataclass(frozen=True)
class LeaseTransform(FunctionWork):
    """What a ``map`` pipeline runs on each message of a lease (picklable)."""

    transform: Transform

    def apply(
        self, rows: list[tuple[Any, ...]], lock_token: str, failed: list[Failure]
    ) -> pa.RecordBatch:
        """The output rows of lease ``rows``; their failures are added to ``failed``. A row
        that does not fit the output schema is a validation failure, which is permanent:
        its message is dead-lettered."""
        run = run_isolated if self.isolate else run_inline
        seqs: list[int] = []
        outputs: list[Any] = []
        results = run(OnLeaseRows(self.transform), rows, self.permanent)
        if len(rows) >= MIN_FAILURES and all(result is None for result in results):
            log.warning(
                "map function %s returned None for each of this batch's %s message(s):"
                " they are completed with no row, as filtered; return a row for a message"
                " (is a return statement missing?), and None only to skip one on purpose",
                function_name(self.transform),
                len(rows),
            )
        for row, result in zip(rows, results, strict=True):
            if result is None:
                continue  # filtered out: completed without an output row
            seq = row[0]  # LEASE_COLUMNS begin with the sequence number
            kind = type(result)  # not isinstance, nor a match: this runs once per message
            if kind is Failed or kind is Crashed:
                failed.append(settlement(seq, lock_token, result))
            else:
                seqs.append(seq)
                outputs.append(result)
        batch, unfit = self.output.batch(outputs)
        failed += [dead_lettering(seqs[index], lock_token, failure) for index, failure in unfit]
        return batch


Work = LeaseTransform | BatchTransform  # a function of one message, or of a batch of them


class PipelineSource(DataSource):
    """Reads a lease (options as for the ``poisonq`` source, with ``lease``) and yields the
    transform's output. Subclassed per pipeline by :func:`pipeline_source`."""

    work: ClassVar[Work]
    source_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    def schema(self) -> StructType:
        return self.work.output.struct

    def reader(self, schema: StructType) -> PipelineReader:
        return PipelineReader(SourceOptions.parse(self.options), self.work)


class PipelineReader(BatchReader):
    def __init__(self, options: SourceOptions, work: Work) -> None:
        super().__init__(options)
        self.work = work

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Transform the partition's rows; settle its failures in one transaction at the
        end, unless they show a defect, which fails the task with nothing settled."""
        assert isinstance(partition, SequenceRange) and partition.lease is not None
        lease = partition.lease
        failed: list[Failure] = []
        with open_existing(self.options.url) as broker, collector_paused():
            rows = broker.lease_rows(lease, partition.lo, partition.hi)
        # Only first deliveries tell a defect (see poisonq.defects).
        fresh = {row[0] for row in rows if row[_DELIVERY_COUNT] == 1}
        seen = 0
        for start, stop in _chunks(len(rows)):
            chunk = rows[start:stop]
            with collector_paused():
                batch = self.work.apply(chunk, lease.lock_token, failed)
            seen += sum(1 for row in chunk if row[0] in fresh)
            failures = (f.failure for f in failed if f.failure and f.sequence_number in fresh)
            defect = find_defect(failures, seen, self.work.max_failure_ratio)
            if defect is not None:
                raise DefectFound(defect)
            yield batch
        yield from self._settle(lease, failed, len(rows))

    def _settle(self, lease: Lease, failed: list[Failure], count: int) -> Iterator[pa.RecordBatch]:
        """Settle the failures of the partition's ``count`` messages, and run again the
        messages that crashed the worker that the queue's retry policy returns to it at
        once: taken back into the lease, each counting a delivery (in the transaction that
        settles the partition's failures), they run in this task, not in a batch of their
        own later (a Spark job's fixed cost for a handful of messages), each up to
        :data:`CRASH_RERUNS` times.
        Only crashes that look like poison run again, no more of the partition than the
        defect ratio (``max_failure_ratio``): a function that crashes on most messages is a
        defect, and running each again until its deliveries ran out would dead-letter good
        messages before the run's defect check (across batches, on first deliveries) stops
        it. One broker for all of it: opening one per round would cost more than the
        round's transaction (on SQLite 1.5 ms against 0.6)."""
        if not failed:
            return
        ratio = self.work.max_failure_ratio
        reruns = CRASH_RERUNS
        if ratio is not None and sum(map(crashed, failed)) > ratio * count:
            reruns = 0
        with open_existing(self.options.url) as broker:
            for rerun in range(reruns + 1):
                again = {f.sequence_number for f in failed if rerun < reruns and crashed(f)}
                if again:
                    rows, _ = broker.retry_in_lease(lease, failed, again)
                else:
                    broker.settle_held(self.options.address, failed)
                    rows = []
                failed = []
                for start in range(0, len(rows), ARROW_BATCH_ROWS):
                    with collector_paused():
                        chunk = rows[start : start + ARROW_BATCH_ROWS]
                        yield self.work.apply(chunk, lease.lock_token, failed)
                if not failed:
                    return


def _chunks(count: int) -> Iterator[tuple[int, int]]:
    """The bounds of a partition's chunks of rows: a first one of :data:`FIRST_CHUNK`, then
    :data:`~poisonq.spark.source.ARROW_BATCH_ROWS` each. A defect is judged after each
    chunk, so a function that fails every message (rows that never fit the schema, a
    ``NameError``) stops its task after the first few, not after a chunk of 10,000 each run
    under the crash guard and each failure recorded with its traceback."""
    start, size = 0, FIRST_CHUNK
    while start < count:
        yield start, min(count, start + size)
        start, size = start + size, ARROW_BATCH_ROWS


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: reading and transforming a lease allocates a
    dict or a tuple per message, all freed by reference counting, yet each allocation
    counts toward the collector's next pass, and those passes walk a worker's whole heap
    (a third of the time of a simple transform). Not across a ``yield``: the code that
    takes the batch runs with the collector as it found it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def pipeline_source(name: str, work: Work) -> type[PipelineSource]:
    """A :class:`PipelineSource` registered as ``name`` that runs ``work``."""
    return type("PipelineSource_" + name, (PipelineSource,), {"work": work, "source_name": name})
