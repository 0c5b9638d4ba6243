"""Where the pipeline runner writes a batch's good rows: the one place that knows the sink.

Every sink keeps the runner's idempotence rule: a batch is written under its consumer and
its lease's number, replacing whatever was written for that lease before, and the lease's
messages are completed only once the write has returned. A batch replayed after a crash so
replaces its own output instead of adding to it; a lease whose locks ran out before it was
completed has its output replaced by nothing (its messages come again in a later lease); and
consumers, whose leases are numbered on their own, never write over each other. Isolation
jobs (:mod:`poisonq.spark.isolation`) write their parts where nothing reads them.

A new sink is a class with the three methods of :class:`Sink`.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from poisonq.model import Lease


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
