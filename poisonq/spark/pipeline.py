"""The pipeline runner: a queue through a per-row transform into a table, poison-proof.

One micro-batch is one lease (see :mod:`poisonq.spark.source`) and costs one Spark job: the
executors read the lease straight from the store and run the transform under the crash guard
(:mod:`poisonq.spark.transform`, :mod:`poisonq.guard`), Spark writes the good rows,
and the failed messages are settled by the executors (a permanent error dead-letters, any
other error or a crash abandons, so the queue's retry policy applies). When the job has
written the batch, the driver completes whatever the lease still holds, in one statement.

Output is idempotent per lease: a batch is written to ``<output>/lease=<n>`` in overwrite
mode and its messages are completed only afterwards, so a batch replayed after a crash
overwrites its own output instead of adding to it.

When a batch job fails as a whole anyway (the sink, the JVM, a crash the guard cannot see),
the batch is bisected into smaller jobs by sequence range until the messages whose jobs fail
alone are found. Only they are abandoned with the job's error; then the batch runs again
without them. A batch in which every message fails alone, or more than
:data:`MAX_GUILTY_PER_BATCH` do, is not blamed on its messages but counted as a failed batch
(a broken sink or transform fails every job, and bisecting it down to single messages would
cost two jobs per message); ``max_failed_batches`` consecutive failed batches stop the runner
with a report (Service Broker's safety net).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

import poisonq
from poisonq.errors import EntityDisabledError, InvalidOptionError, PoisonqError
from poisonq.guard import Transform
from poisonq.model import Abandon, FailureRecord, Lease
from poisonq.spark.source import absolute_url
from poisonq.spark.transform import LeaseTransform, pipeline_source

log = logging.getLogger(__name__)
JobError = (PySparkException, Py4JError)
MAX_GUILTY_PER_BATCH = 16


class _NotPoison(Exception):
    """Isolation found more guilty messages than poison explains."""


class PipelineStoppedError(PoisonqError):
    """The runner stopped: ``max_failed_batches`` batches in a row failed as a whole, or the
    queue stopped delivering (faulted on a poison message, auto-disabled, disabled). The
    report says what was done until then; ``cause`` is the queue's error, if that was it."""

    def __init__(
        self, report: PipelineReport, error: str, cause: EntityDisabledError | None = None
    ) -> None:
        if cause is None:
            error = (
                f"stopped after {report.failed_batches_in_a_row} failed batches in a row: {error}"
            )
        super().__init__(error)
        self.report = report
        self.cause = cause


@dataclass
class PipelineReport:
    """What a run did; ``dead_lettered`` counts by reason."""

    batches: int = 0
    leased: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    isolation_jobs: int = 0
    failed_batches: int = 0
    failed_batches_in_a_row: int = 0
    elapsed: float = 0.0

    @property
    def messages_per_second(self) -> float:
        return self.leased / self.elapsed if self.elapsed else 0.0


class Pipeline:
    """Runs ``transform`` over the messages of ``queue`` into ``output``, one lease per batch.

    ``transform(message) -> dict | None`` gets a message as a dict (``sequence_number``,
    ``message_id``, ``body`` as bytes, ``subject``, ``properties``, ``delivery_count``,
    ``enqueued_time``, ...) and returns one output row that fits ``schema`` (a Spark DDL
    string or ``StructType``), or ``None`` to drop the message from the output while still
    completing it. It runs on executors, so it must be picklable.
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        url: str,
        queue: str,
        transform: Transform,
        schema: str | StructType,
        output: str,
        consumer: str = "pipeline",
        batch_size: int = 100_000,
        lock_duration: float | None = None,
        output_format: str = "parquet",
        permanent: tuple[type[BaseException], ...] = (),
        isolate: bool = True,
        max_failed_batches: int | None = 5,
    ) -> None:
        if batch_size < 1:
            raise InvalidOptionError("batch_size must be at least 1")
        if max_failed_batches is not None and max_failed_batches < 1:
            raise InvalidOptionError("max_failed_batches must be at least 1, or None for no limit")
        struct = StructType.fromDDL(schema) if isinstance(schema, str) else schema
        if not isinstance(struct, StructType):
            raise InvalidOptionError(f"schema must describe a struct, not {schema!r}")
        self.spark = spark
        self.url = absolute_url(url)
        self.queue = queue
        self.output = output.rstrip("/")
        self.consumer = consumer
        self.batch_size = batch_size
        self.lock_duration = lock_duration
        self.output_format = output_format
        self.max_failed_batches = max_failed_batches
        work = LeaseTransform(transform, struct, permanent, isolate)
        self._source = f"poisonq_pipeline_{id(self):x}"
        spark.dataSource.register(pipeline_source(self._source, work))

    def run(
        self,
        until_idle: bool = True,
        max_batches: int | None = None,
        progress: Callable[[PipelineReport], None] | None = None,
    ) -> PipelineReport:
        """Process leases until the queue is idle (or ``max_batches`` were run). A lease left
        unfinished by an earlier run is replayed first."""
        report = PipelineReport()
        started = time.monotonic()
        with poisonq.connect(self.url) as broker:
            dead_before = _dead_letters(broker, self.queue)
            lease = broker.lease(self.queue, self.consumer)
            number = lease.number if lease else 0
            if lease is not None and broker.lease_sequence_numbers(lease):
                self._batch(broker, lease, report)
            while max_batches is None or report.batches < max_batches:
                try:
                    lease = broker.acquire_lease(
                        self.queue, self.consumer, number + 1, self.batch_size, self.lock_duration
                    )
                except EntityDisabledError as exc:
                    report.dead_lettered = _dead_letters(broker, self.queue) - dead_before
                    report.elapsed = time.monotonic() - started
                    raise PipelineStoppedError(report, f"stopped: {exc}", exc) from exc
                if lease is None:
                    if until_idle:
                        break
                    time.sleep(1.0)
                    continue
                number = lease.number
                # By reason, including what expired before it could be leased.
                report.dead_lettered = self._batch(broker, lease, report) - dead_before
                report.elapsed = time.monotonic() - started
                if progress is not None:
                    progress(report)
            report.dead_lettered = _dead_letters(broker, self.queue) - dead_before
        report.elapsed = time.monotonic() - started
        return report

    def _batch(self, broker: poisonq.Broker, lease: Lease, report: PipelineReport) -> Counter[str]:
        """One lease: write it, isolating guilty messages if the job fails, then complete.
        Returns the dead-letter queue's counts by reason afterwards."""
        report.batches += 1
        report.leased += lease.count
        before = _dead_letters(broker, self.queue)
        with _LeaseRenewer(broker, lease, self.lock_duration):
            for _attempt in range(3):
                try:
                    self._write(lease, None, self._path(lease))
                    report.failed_batches_in_a_row = 0
                    break
                except JobError as exc:
                    log.warning("batch %d failed as a whole; isolating: %s", lease.number, exc)
                    if not self._isolate(broker, lease, exc, report):
                        self._fail_batch(broker, lease, exc, report)
                        break
            completed = broker.complete_lease(lease)
        after = _dead_letters(broker, self.queue)
        report.completed += completed
        dead = after - before
        report.retried += max(0, lease.count - completed - dead.total())
        return after

    def _write(self, lease: Lease, span: tuple[int, int] | None, path: str) -> None:
        """The batch's one Spark job: read the lease through the transform, write."""
        reader = (
            self.spark.read.format(self._source)
            .option("url", self.url)
            .option("queue", self.queue)
            .option("consumer", self.consumer)
            .option("lease", lease.number)
        )
        if span is not None:
            reader = reader.option("minSequence", span[0]).option("maxSequence", span[1])
        reader.load().write.mode("overwrite").format(self.output_format).save(path)

    def _path(self, lease: Lease) -> str:
        return f"{self.output}/lease={lease.number}"

    def _isolate(
        self, broker: poisonq.Broker, lease: Lease, error: BaseException, report: PipelineReport
    ) -> bool:
        """Bisect the failed batch into smaller jobs; abandon the messages that fail alone.
        False when every message, or more than :data:`MAX_GUILTY_PER_BATCH`, fail alone:
        then the batch, not a message, is at fault."""
        held = broker.lease_sequence_numbers(lease)
        guilty: list[int] = []
        scratch = f"{self.output}/_isolation"

        def passes(part: list[int], known_to_fail: bool) -> bool:
            if not (known_to_fail and len(part) > 1):
                report.isolation_jobs += 1
                try:
                    self._write(lease, (part[0], part[-1]), scratch)
                    return True
                except JobError:
                    if len(part) == 1:
                        guilty.append(part[0])
                        if len(guilty) > MAX_GUILTY_PER_BATCH:
                            raise _NotPoison from None
                        return False
            middle = len(part) // 2
            left = passes(part[:middle], False)
            passes(part[middle:], left)
            return False

        try:
            if held:
                passes(held, False)
        except _NotPoison:
            return False
        if len(held) > 1 and len(guilty) == len(held):
            return False
        failure = _job_failure(error)
        broker.settle_held(self.queue, [Abandon(s, lease.lock_token, failure) for s in guilty])
        return True

    def _fail_batch(
        self, broker: poisonq.Broker, lease: Lease, error: BaseException, report: PipelineReport
    ) -> None:
        """Every message of the batch fails: the sink or the job is broken, not a message.
        Give the messages back (the retry policy still counts the delivery) and count it."""
        report.failed_batches += 1
        report.failed_batches_in_a_row += 1
        failure = _job_failure(error)
        held = broker.lease_sequence_numbers(lease)
        broker.settle_held(self.queue, [Abandon(s, lease.lock_token, failure) for s in held])
        if self.max_failed_batches and report.failed_batches_in_a_row >= self.max_failed_batches:
            raise PipelineStoppedError(report, f"{failure.error_type}: {failure.message}")


def _job_failure(error: BaseException) -> FailureRecord:
    """The failure a Spark job error leaves on a message: its first lines, not the JVM stack."""
    text = str(error).strip()
    java = getattr(error, "java_exception", None)  # a Py4JJavaError's message is only "o42.save"
    summary = str(java.toString()) if java is not None else text
    first = next((line for line in summary.splitlines() if line.strip()), type(error).__name__)
    return FailureRecord(
        time.time(),
        "BatchJobFailed",
        first[:1024],
        traceback=text[:16_384],
        fingerprint="batch-job-failed",
    )


def _dead_letters(broker: poisonq.Broker, queue: str) -> Counter[str]:
    return Counter({g.key or "": g.count for g in broker.dead_letter_groups(queue, "reason")})


class _LeaseRenewer:
    """Renews a lease's locks from a thread while its batch runs, every third of the lock
    duration, so a long batch never loses its lease."""

    def __init__(self, broker: poisonq.Broker, lease: Lease, lock_duration: float | None) -> None:
        self._broker = broker
        self._lease = lease
        self._duration = lock_duration
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poisonq-lease-renewer", daemon=True)

    def _run(self) -> None:
        seconds = self._duration or self._broker.get_queue(self._lease.entity).options.lock_duration
        while not self._stop.wait(seconds / 3):
            self._broker.renew_lease(self._lease, self._duration)

    def __enter__(self) -> _LeaseRenewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
