"""The pipeline runner: a queue through a per-row transform into a table, poison-proof.

One micro-batch is one lease (see :mod:`poisonq.spark.source`) and costs one Spark job: the
executors read the lease straight from the store and run the transform under the crash guard
(:mod:`poisonq.spark.transform`, :mod:`poisonq.guard`), Spark writes the good rows,
and the failed messages are settled by the executors (a permanent error dead-letters, any
other error or a crash abandons, so the queue's retry policy applies). When the job has
written the batch, the driver completes whatever the lease still holds, in one statement.

Output is idempotent per lease and never shared between consumers: a batch is written to
``<output>/consumer=<name>/lease=<n>`` in overwrite mode and its messages are completed only
afterwards, so a batch replayed after a crash overwrites its own output instead of adding to
it, and another consumer's leases (numbered on their own) land beside it.

A defect is not poison (:mod:`poisonq.defects`). When most of a task's messages fail the
same way, the task fails the job with the defect before anything is settled or written; when
a job fails as a whole (the sink, the JVM, a crash the guard cannot see) and the first and
last messages of the batch each fail the same way alone, the job is broken, not a message.
Either way the lease is released (no delivery counted) and :class:`PipelineStoppedError`
says why. Otherwise the failed batch is bisected into smaller jobs by sequence range until
the messages whose jobs fail alone are found; only they are abandoned with the job's error,
and the batch runs again without them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

import poisonq
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, Defect, check_ratio
from poisonq.errors import EntityDisabledError, InvalidOptionError, PoisonqError
from poisonq.failures import MAX_MESSAGE, MAX_TRACEBACK
from poisonq.guard import Transform
from poisonq.model import Abandon, FailureRecord, Lease
from poisonq.names import validate_name
from poisonq.spark.rows import OutputSchema
from poisonq.spark.source import absolute_url
from poisonq.spark.transform import LeaseTransform, defect_in, pipeline_source

log = logging.getLogger(__name__)
JobError = (PySparkException, Py4JError)
_JVM_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")
# The first Python traceback in a job error: its frames (indented) and its exception line.
_PYTHON_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n)+(?P<error>\S.*)"
)
MAX_GUILTY_PER_BATCH = 16


class _NotPoison(Exception):
    """Isolation found more guilty messages than poison explains."""


class PipelineStoppedError(PoisonqError):
    """The runner stopped: a batch showed a defect (its messages are back in the queue, no
    delivery counted: ``defect`` has the first failure and its traceback), or the queue
    stopped delivering (faulted on a poison message, auto-disabled, disabled: ``cause`` is
    the queue's error). ``report`` says what was done until then."""

    def __init__(
        self,
        report: PipelineReport,
        error: str,
        *,
        cause: EntityDisabledError | None = None,
        defect: Defect | None = None,
    ) -> None:
        super().__init__(error)
        self.report = report
        self.cause = cause
        self.defect = defect

    @property
    def traceback(self) -> str:
        """The defect's first failure as its traceback (or job error) shows it."""
        return self.defect.failure.traceback if self.defect else ""


@dataclass
class PipelineReport:
    """What a run did; ``dead_lettered`` counts by reason."""

    batches: int = 0
    leased: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    isolation_jobs: int = 0
    elapsed: float = 0.0

    @property
    def messages_per_second(self) -> float:
        return self.leased / self.elapsed if self.elapsed else 0.0


class Pipeline:
    """Runs ``transform`` over the messages of ``queue`` into ``output``, one lease per batch.

    ``transform(message)`` gets a message as a dict (``sequence_number``, ``message_id``,
    ``body`` as bytes, ``subject``, ``properties``, ``delivery_count``, ``enqueued_time``,
    ...) and returns one output row of ``schema`` (a Spark DDL string or ``StructType``): a
    dict or named ``Row`` with every field (extra keys are an error unless
    ``ignore_extra_fields``), or a tuple, list or ``Row`` by position; or ``None`` to
    complete the message without an output row. Anything else dead-letters the message
    with ``OutputSchemaMismatch`` (see :mod:`poisonq.spark.rows`). It runs on executors, so
    it must be picklable. ``max_failure_ratio`` (``None``: never) is the share of a batch
    that may fail the same way before the runner calls it a defect and stops.
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
        ignore_extra_fields: bool = False,
        max_failure_ratio: float | None = DEFAULT_MAX_FAILURE_RATIO,
    ) -> None:
        if batch_size < 1:
            raise InvalidOptionError("batch_size must be at least 1")
        validate_name(consumer)
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
        self._struct = struct
        work = LeaseTransform(
            transform,
            OutputSchema(struct, ignore_extra_fields),
            permanent,
            isolate,
            check_ratio(max_failure_ratio),
        )
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
            try:
                lease = broker.lease(self.queue, self.consumer)
                number = lease.number if lease else 0
                if lease is not None and broker.lease_sequence_numbers(lease):
                    self._batch(broker, lease, report)
                elif lease is not None and lease.completed_at is None:
                    # Its locks ran out before it was completed: whatever it wrote is an
                    # orphan, and its messages come again in a later lease.
                    self._discard_output(lease)
                while max_batches is None or report.batches < max_batches:
                    try:
                        lease = broker.acquire_lease(
                            self.queue,
                            self.consumer,
                            number + 1,
                            self.batch_size,
                            self.lock_duration,
                        )
                    except EntityDisabledError as exc:
                        raise PipelineStoppedError(report, f"stopped: {exc}", cause=exc) from exc
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
            finally:  # also in the report a PipelineStoppedError carries
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
            for attempt in range(3):
                try:
                    self._write(lease, None, self._path(lease))
                    break
                except JobError as exc:
                    defect = defect_in(exc)
                    if defect is None and attempt == 2:  # two rounds of isolation did not do
                        defect = _job_defect(exc, broker.lease_sequence_numbers(lease))
                    elif defect is None:
                        log.warning("batch %d failed as a whole; isolating: %s", lease.number, exc)
                        defect = self._isolate(broker, lease, exc, report)
                    if defect is not None:
                        self._stop(broker, lease, defect, report)
            completed = broker.complete_lease(lease)
        after = _dead_letters(broker, self.queue)
        report.completed += completed
        dead = after - before
        report.retried += max(0, lease.count - completed - dead.total())
        return after

    def _stop(
        self,
        broker: poisonq.Broker,
        lease: Lease,
        defect: Defect,
        report: PipelineReport,
    ) -> None:
        """Give the lease back (no delivery counted) and stop with the defect (``run`` fills
        in the report's dead-letter counts and time)."""
        released = broker.release_lease(lease)
        message = (
            f"stopped at lease {lease.number}: {defect}; {released} message(s) given back"
            " to the queue without a delivery counted, nothing written for the batch"
        )
        raise PipelineStoppedError(report, message, defect=defect) from None

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

    def _discard_output(self, lease: Lease) -> None:
        """Overwrite a lease's output with nothing (with Spark, so on any file system)."""
        log.warning("lease %d was never completed: discarding its output", lease.number)
        empty = self.spark.createDataFrame([], self._struct)
        empty.write.mode("overwrite").format(self.output_format).save(self._path(lease))

    def _path(self, lease: Lease) -> str:
        return f"{self.output}/consumer={quote(self.consumer, safe='')}/lease={lease.number}"

    def _isolate(
        self, broker: poisonq.Broker, lease: Lease, error: BaseException, report: PipelineReport
    ) -> Defect | None:
        """Find and abandon the messages whose jobs fail alone. A defect instead when the
        first and the last message on its first delivery each fail alone the way the batch
        did (a broken sink or transform fails every job, and bisecting it would cost two jobs
        per message), or when more than :data:`MAX_GUILTY_PER_BATCH` first deliveries, or
        all of at least three, fail alone. Messages delivered before are suspects already:
        a batch of them failing is poison coming back, not a defect."""
        held = broker.lease_sequence_numbers(lease)
        fresh = broker.lease_sequence_numbers(lease, first_delivery=True)
        fresh_set = set(fresh)
        scratch = f"{self.output}/_isolation/consumer={quote(self.consumer, safe='')}"
        signature = _signature(error)
        guilty: list[int] = []

        def fails(part: list[int]) -> BaseException | None:
            report.isolation_jobs += 1
            try:
                self._write(lease, (part[0], part[-1]), scratch)
                return None
            except JobError as exc:
                return exc

        if len(fresh) >= 3:
            probes = [fails([seq]) for seq in (fresh[0], fresh[-1])]
            if all(p is not None and _signature(p) == signature for p in probes):
                return _job_defect(error, fresh)

        def passes(part: list[int], known_to_fail: bool) -> bool:
            if not (known_to_fail and len(part) > 1):
                failure = fails(part)
                if failure is None:
                    return True
                if len(part) == 1:
                    guilty.append(part[0])
                    if len(fresh_set.intersection(guilty)) > MAX_GUILTY_PER_BATCH:
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
            return _job_defect(error, fresh)
        if len(fresh) >= 3 and fresh_set.issubset(guilty):
            return _job_defect(error, fresh)
        failure = _job_failure(error)
        broker.settle_held(self.queue, [Abandon(s, lease.lock_token, failure) for s in guilty])
        return None


def _signature(error: BaseException) -> str:
    """What two job failures share when they fail the same way: the error's first line
    without the numbers that name stages, tasks and hosts."""
    return re.sub(r"\d+", "#", _job_failure(error).message)


def _job_defect(error: BaseException, held: list[int]) -> Defect:
    return Defect(_job_failure(error), len(held), len(held))


def _job_failure(error: BaseException) -> FailureRecord:
    """The failure a Spark job error leaves on a message. When a Python traceback is in it
    (a Python worker failed), that traceback and its exception line; else the error's first
    line and its chain of errors without the JVM's frames."""
    text = str(error).strip()
    java = getattr(error, "java_exception", None)  # a Py4JJavaError's message is only "o42.save"
    summary = str(java.toString()) if java is not None else text
    first = next((line for line in summary.splitlines() if line.strip()), type(error).__name__)
    chain = "\n".join(line for line in text.splitlines() if not _JVM_FRAME.match(line))
    python = _PYTHON_TRACEBACK.search(text)
    if python is not None:
        first, chain = python.group("error"), python.group(0)
    return FailureRecord(
        time.time(),
        "BatchJobFailed",
        first[:MAX_MESSAGE],
        traceback=chain[-MAX_TRACEBACK:],
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
