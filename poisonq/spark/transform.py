"""The executor side of the pipeline: a data source that reads a lease and transforms it.

Reading the lease and transforming it happen in one Python pass per partition: the rows go
from the store straight into the transform and out as Arrow in the output schema. A plain
read followed by ``mapInArrow`` would move every message from Python to the JVM and back
again, which costs more than the transform. Each pipeline registers its own subclass of
:class:`PipelineSource` that carries the transform, because options can only carry strings.

The failed messages of a partition are settled in one transaction when the partition has
been read: a permanent error dead-letters, any other error or a crash abandons. The messages
that succeeded stay locked under the lease until the driver has written the batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

import poisonq
from poisonq.guard import Crashed, Failed, Ok, Transform, run_inline, run_isolated
from poisonq.lease_rows import OnLeaseRows
from poisonq.model import Abandon, DeadLetter, FailureRecord, Settlement
from poisonq.spark.source import ARROW_BATCH_ROWS, BatchReader, SequenceRange, SourceOptions

_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, KeyError)


@dataclass(frozen=True)
class LeaseTransform:
    """What a pipeline runs on each message of a lease (picklable)."""

    transform: Transform
    output: StructType
    permanent: tuple[type[BaseException], ...]
    isolate: bool

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self.output)

    def apply(
        self, rows: list[tuple[Any, ...]], lock_token: str, failed: list[Settlement]
    ) -> pa.RecordBatch:
        """The output rows of lease ``rows``; their failures are added to ``failed``."""
        run = run_isolated if self.isolate else run_inline
        good: list[tuple[int, dict[str, Any]]] = []
        results = run(OnLeaseRows(self.transform), rows, self.permanent)
        for row, result in zip(rows, results, strict=True):
            seq = row[0]  # LEASE_COLUMNS begin with the sequence number
            match result:
                case Ok(dict() as output):
                    good.append((seq, output))
                case Ok():
                    continue  # filtered out: completed without an output row
                case Failed(failure, True):
                    failed.append(_dead_letter(seq, lock_token, failure))
                case Failed(failure, False) | Crashed(failure):
                    failed.append(Abandon(seq, lock_token, failure))
        return self._output_batch(good, lock_token, failed)

    def _output_batch(
        self, good: list[tuple[int, dict[str, Any]]], lock_token: str, failed: list[Settlement]
    ) -> pa.RecordBatch:
        """The good rows as Arrow. A row that does not fit the output schema is a validation
        failure, which is permanent: its message is dead-lettered."""
        schema = self.arrow_schema
        try:
            return pa.RecordBatch.from_pylist([out for _, out in good], schema=schema)
        except _ARROW_ERRORS:
            fitting = []
            for seq, output in good:
                try:
                    pa.RecordBatch.from_pylist([output], schema=schema)
                    fitting.append(output)
                except _ARROW_ERRORS as exc:
                    failure = FailureRecord(time.time(), "OutputSchemaMismatch", str(exc)[:4096])
                    failed.append(_dead_letter(seq, lock_token, failure))
            return pa.RecordBatch.from_pylist(fitting, schema=schema)


def _dead_letter(seq: int, lock_token: str, failure: FailureRecord) -> DeadLetter:
    reason = failure.error_type.rsplit(".", 1)[-1]
    description = f"{failure.error_type}: {failure.message}"
    return DeadLetter(seq, lock_token, reason, description, failure)


class PipelineSource(DataSource):
    """Reads a lease (options as for the ``poisonq`` source, with ``lease``) and yields the
    transform's output. Subclassed per pipeline by :func:`pipeline_source`."""

    work: ClassVar[LeaseTransform]
    source_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    def schema(self) -> StructType:
        return self.work.output

    def reader(self, schema: StructType) -> PipelineReader:
        return PipelineReader(SourceOptions.parse(self.options), self.work)


class PipelineReader(BatchReader):
    def __init__(self, options: SourceOptions, work: LeaseTransform) -> None:
        super().__init__(options)
        self.work = work

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange) and partition.lease is not None
        lease = partition.lease
        failed: list[Settlement] = []
        with poisonq.connect(self.options.url) as broker:
            rows = broker.lease_rows(lease, partition.lo, partition.hi)
        for start in range(0, len(rows), ARROW_BATCH_ROWS):
            yield self.work.apply(rows[start : start + ARROW_BATCH_ROWS], lease.lock_token, failed)
        if failed:
            with poisonq.connect(self.options.url) as broker:
                broker.settle_held(self.options.address, failed)


def pipeline_source(name: str, work: LeaseTransform) -> type[PipelineSource]:
    """A :class:`PipelineSource` registered as ``name`` that runs ``work``."""
    return type("PipelineSource_" + name, (PipelineSource,), {"work": work, "source_name": name})
