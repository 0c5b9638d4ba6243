"""The Spark job of one batch, for each kind of pipeline: what the runner writes.

A batch is a lease read as a DataFrame (:class:`LeaseReader`, straight from the store on the
executors). :class:`MapJob` reads it through a data source that runs a function of one
message under the crash guard (:mod:`poisonq.spark.transform`); :class:`FrameJob` reads the
plain lease and runs the user's DataFrame transform, then the gate that dead-letters rows
failing an expectation and passes only the rows of good messages (:mod:`poisonq.spark.gate`).
Either way :meth:`frame` is lazy: the runner writes it, once per batch or per part of one
when it isolates a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from pyspark import StorageLevel
from pyspark.accumulators import Accumulator
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructType

from poisonq.errors import InvalidOptionError
from poisonq.failures import first_line
from poisonq.model import Lease
from poisonq.spark.connect import require_classic
from poisonq.spark.gate import Runs, RunsParam, gated
from poisonq.spark.isolation import worker_crashed
from poisonq.spark.schema import MESSAGE_SCHEMA_DDL
from poisonq.spark.session import quiet_query_errors
from poisonq.spark.settling import LeaseContext
from poisonq.spark.source import SEQUENCE, register, untagged
from poisonq.spark.transform import LeaseTransform, Work, pipeline_source
from poisonq.spark.udf import settling

Span = tuple[int, int] | None
Batch = tuple[DataFrame, Accumulator[Runs] | None]


@dataclass(frozen=True)
class LeaseReader:
    """Reads a consumer's lease (or a span of it) with a data source."""

    spark: SparkSession
    url: str
    queue: str
    consumer: str

    def read(self, source: str, lease: Lease, span: Span) -> DataFrame:
        reader = (
            self.spark.read.format(source)
            .option("url", self.url)
            .option("queue", self.queue)
            .option("consumer", self.consumer)
            .option("lease", lease.number)
        )
        if span is not None:
            reader = reader.option("minSequence", span[0]).option("maxSequence", span[1])
        return untagged(reader.load())  # the output files need not name the store


class MapJob:
    """``map=`` and ``map_batches=``: each pipeline registers its own data sources, which
    carry the function (options can only carry strings): one that runs it in the Python
    worker, and, with ``work.isolate``, one that runs it under the crash guard
    (:mod:`poisonq.worker.guard`).

    A function of one message (``map=``) runs under the guard from the first batch: the
    guard costs under a microsecond a row (docs/speed.md), far less than a crash's failed
    Spark job and its batch written again, and a failure under it has the traceback and
    fingerprint it has in the worker. A function of a batch runs in the worker, since the
    guard calls it on one message at a time (a batch function's vectorised work would be
    lost on every batch, crash or not); the guard is switched on for the rest of the run
    when a Python worker dies: the batch that crashed is written again under the guard,
    which then finds each crashing message within its task."""

    def __init__(self, reader: LeaseReader, work: Work) -> None:
        self.reader = reader
        self.struct = work.output.struct
        self.permanent = work.permanent
        spark = reader.spark
        name = f"poisonq_pipeline_{id(self):x}"
        self._guarded: str | None = None  # the guarded source to switch to, if not on yet
        if work.isolate and isinstance(work, LeaseTransform):
            self._source = f"{name}_guarded"
            spark.dataSource.register(pipeline_source(self._source, work))
            return
        self._source = name
        spark.dataSource.register(pipeline_source(name, replace(work, isolate=False)))
        if work.isolate:
            self._guarded = f"{name}_guarded"
            spark.dataSource.register(pipeline_source(self._guarded, work))

    def frame(self, lease: Lease, span: Span, source: DataFrame | None = None) -> Batch:
        return self.reader.read(self._source, lease, span), None

    def read_once(self, lease: Lease) -> DataFrame | None:
        """None: the data source that reads a lease also runs the function (under the
        crash guard, which finds a crashing message within its task), so each part is read
        from the store."""
        return None

    def guard_after(self, error: BaseException) -> bool:
        """Switch the crash guard on if ``error`` is a Python worker's death and it is not
        on yet; whether it was switched on (the batch is then to be written again)."""
        if self._guarded is None or not worker_crashed(error):
            return False
        self._source, self._guarded = self._guarded, None
        return True


class FrameJob:
    """``transform=``: the whole plan is built once on an empty batch, so a mistake in it
    shows before any lease is taken."""

    def __init__(
        self,
        reader: LeaseReader,
        transform: Callable[[DataFrame], DataFrame],
        expectations: Mapping[str, str],
        permanent: tuple[type[BaseException], ...],
        max_failure_ratio: float | None,
    ) -> None:
        self.reader = reader
        self.transform = transform
        self.expectations = expectations
        self.permanent = permanent
        self.max_failure_ratio = max_failure_ratio
        spark = reader.spark
        require_classic(
            spark,
            "the pipeline runner's transform=",
            "run the pipeline in a classic session (spark-submit, or pyspark on the cluster),"
            " or over Connect use map= (a function of one message) or a stream with"
            " poisonq.spark.foreach_batch, whose expectations work over Connect",
        )
        register(spark)
        nothing = Lease(reader.queue, reader.consumer, 0, "", 0, 0, 0, 0.0)
        empty = spark.createDataFrame([], MESSAGE_SCHEMA_DDL)
        with quiet_query_errors():
            self.struct = self._gated(empty, nothing, self._runs()).schema

    def frame(self, lease: Lease, span: Span, source: DataFrame | None = None) -> Batch:
        """The batch's gated output, read from the store, or from ``source`` (the lease's
        input read once, :meth:`read_once`) when one is given."""
        passed = self._runs()
        if source is None:
            batch = self.reader.read("poisonq", lease, span)
        elif span is None:
            batch = source
        else:
            batch = source.filter(F.col(SEQUENCE).between(span[0], span[1]))
        return self._gated(batch, lease, passed), passed

    def read_once(self, lease: Lease) -> DataFrame | None:
        """The messages the lease holds, read from the store by the first job that needs
        them and kept by Spark (memory, then disk) for the jobs after it: isolating a
        failure runs the transform over parts of the batch many times, and reading each
        part from the store again cost more than the transform. The caller unpersists it."""
        return self.reader.read("poisonq", lease, None).persist(StorageLevel.MEMORY_AND_DISK)

    def guard_after(self, error: BaseException) -> bool:
        """A DataFrame transform has no crash guard: a crash is isolated by jobs."""
        return False

    def _runs(self) -> Accumulator[Runs]:
        return self.reader.spark.sparkContext.accumulator([], RunsParam())

    def _gated(self, batch: DataFrame, lease: Lease, passed: Accumulator[Runs]) -> DataFrame:
        """The transform's output through the gate."""
        reader = self.reader
        context = LeaseContext(
            reader.url, reader.queue, lease, self.permanent, self.max_failure_ratio
        )
        with settling(context):
            out = self._output(batch)
        return gated(out, self.expectations, context, passed)

    def _output(self, batch: DataFrame) -> DataFrame:
        """``transform(batch)``, checked: a DataFrame that keeps each row's sequence number,
        or :class:`InvalidOptionError` saying what to change."""
        hint = (
            "transform= takes the batch as a DataFrame and returns the output DataFrame (as"
            " DataFrame.transform does); a function of one message (a dict) goes in map="
            " with schema="
        )
        try:
            out = self.transform(batch)
        except PySparkException as exc:
            first = first_line(exc)
            message = f"the transform failed on the batch DataFrame: {first}"
            if "`sequence_number`" in first:
                message += (
                    " (a poisonq.spark.udf takes the message's sequence_number from the"
                    " DataFrame it is applied to: apply it to the batch's rows, not to a"
                    " table joined to them)"
                )
            raise InvalidOptionError(message) from exc
        except (TypeError, KeyError, AttributeError) as exc:  # what a dict's user meets
            raise InvalidOptionError(f"{hint}; given one, it raised {exc!r}") from exc
        except Exception as exc:
            message = f"the transform raised {exc!r} when given the batch DataFrame"
            raise InvalidOptionError(message) from exc
        if not isinstance(out, DataFrame):
            raise InvalidOptionError(f"{hint}; it returned a {type(out).__name__}")
        kind = next((f.dataType for f in out.schema if f.name == SEQUENCE), None)
        if not isinstance(kind, (LongType, IntegerType)):
            raise InvalidOptionError(
                "each row of the transform's output must keep the sequence_number of the"
                " message it comes from (select it from the batch); it has"
                f" {', '.join(out.columns) or 'no columns'}"
            )
        return out


def struct_of(schema: str | StructType) -> StructType:
    struct = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    if not isinstance(struct, StructType):
        raise InvalidOptionError(f"schema must describe a struct, not {schema!r}")
    return struct
