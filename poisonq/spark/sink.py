"""Where the pipeline runner writes a batch's good rows: the one place that knows the sink.

Every sink keeps the runner's idempotence rule: a batch is written under its consumer and
its lease's number, replacing whatever was written for that lease before, and the lease's
messages are completed only once the write has returned. A batch replayed after a crash so
replaces its own output instead of adding to it; a lease whose locks ran out before it was
completed has its output replaced by nothing (its messages come again in a later lease); and
consumers, whose leases are numbered on their own, never write over each other. Isolation
jobs (:mod:`poisonq.spark.isolation`) write their parts where nothing reads them.

A sink is a directory (:class:`FileSink`, any Spark file format) or the user's function
(:class:`FunctionSink`); a new sink is a class with the three methods of :class:`Sink`,
chosen in :func:`sink_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from urllib.parse import quote

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from poisonq.errors import InvalidOptionError
from poisonq.model import Lease

SinkFunction = Callable[[DataFrame, int], None]
DEFAULT_FORMAT = "parquet"


class Sink(Protocol):
    def write(self, frame: DataFrame, lease: Lease) -> None:
        """Write the batch's rows as the lease's output, replacing what it had."""

    def write_aside(self, frame: DataFrame) -> None:
        """Write an isolation job's rows where nothing reads them (the job is what counts:
        whether it fails)."""

    def discard(self, lease: Lease, struct: StructType) -> None:
        """Replace the lease's output with nothing."""


class FileSink:
    """Any Spark file format under a directory, one directory a lease:
    ``<output>/consumer=<name>/lease=<n>``, written in overwrite mode; isolation jobs write
    to ``<output>/_isolation/consumer=<name>``."""

    def __init__(self, spark: SparkSession, output: str, file_format: str, consumer: str) -> None:
        self.spark = spark
        self.output = output.rstrip("/")
        self.file_format = file_format
        self._consumer = quote(consumer, safe="")

    def path(self, lease: Lease) -> str:
        return f"{self.output}/consumer={self._consumer}/lease={lease.number}"

    def write(self, frame: DataFrame, lease: Lease) -> None:
        self._save(frame, self.path(lease))

    def write_aside(self, frame: DataFrame) -> None:
        self._save(frame, f"{self.output}/_isolation/consumer={self._consumer}")

    def discard(self, lease: Lease, struct: StructType) -> None:
        """Overwrite with nothing, with Spark, so on any file system."""
        self._save(self.spark.createDataFrame([], struct), self.path(lease))

    def _save(self, frame: DataFrame, path: str) -> None:
        frame.write.mode("overwrite").format(self.file_format).save(path)


class FunctionSink:
    """The user's ``write(frame, batch)``, called as Spark's ``foreachBatch`` calls its
    function: with a batch's good rows and the batch's number (its lease's, counted per
    consumer). To keep the rule above, the function replaces whatever it wrote for the same
    number before (a batch replayed after a crash comes again with its number; a batch whose
    lease ran out comes with no rows), for example by deleting the number's rows in the same
    transaction that inserts the new ones, or by overwriting a partition named for it.

    Isolation jobs never call it: they evaluate the transform into Spark's ``noop`` format,
    which runs the whole plan and writes nothing. So a failure of the function's own writing
    (a table constraint, a lost connection) is not found in any one message: it fails the
    batch again and again and the run stops with it as a defect, its lease given back."""

    def __init__(self, spark: SparkSession, function: SinkFunction) -> None:
        self.spark = spark
        self.function = function

    def write(self, frame: DataFrame, lease: Lease) -> None:
        self._call(frame, lease)

    def write_aside(self, frame: DataFrame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def discard(self, lease: Lease, struct: StructType) -> None:
        self._call(self.spark.createDataFrame([], struct), lease)

    def _call(self, frame: DataFrame, lease: Lease) -> None:
        """Spark's errors pass as they are (the transform's, met by the function's write, are
        isolated like any job's); the function's own are :class:`SinkFailed`."""
        try:
            self.function(frame, lease.number)
        except (PySparkException, Py4JError):
            raise
        except Exception as exc:
            raise SinkFailed(lease, exc) from exc


class SinkFailed(Exception):
    """The user's sink function raised on its own (not in a Spark job): a defect of the
    sink, whatever the batch held."""

    def __init__(self, lease: Lease, error: Exception) -> None:
        super().__init__(f"the output function failed on batch {lease.number}: {error!r}")
        self.error = error


def sink_for(
    spark: SparkSession, output: str | SinkFunction, file_format: str | None, consumer: str
) -> Sink:
    """The sink ``output`` names: a directory (in ``file_format``, Parquet unless given) or a
    function of a batch."""
    if isinstance(output, str):
        return FileSink(spark, output, file_format or DEFAULT_FORMAT, consumer)
    if not callable(output):
        raise InvalidOptionError(
            "output= is a directory's path or a function write(frame, batch), not"
            f" {type(output).__name__}"
        )
    if file_format is not None:
        raise InvalidOptionError(
            "output_format= goes with an output directory; a function writes its batches as"
            " it likes"
        )
    return FunctionSink(spark, output)
