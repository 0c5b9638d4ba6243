"""The pipeline runner: a queue through a transform into a table, poison-proof.

One micro-batch is one lease (see :mod:`poisonq.spark.source`) and costs one Spark job
(:mod:`poisonq.spark.jobs` builds it for each kind). A ``transform`` is a function over the
batch as a DataFrame: Spark reads the lease straight from the store, runs the user's plan,
and a gate (:mod:`poisonq.spark.gate`) dead-letters the messages whose rows fail an
expectation and passes on only the rows of good messages, which Spark writes; a
:func:`poisonq.spark.udf` settles the message of a row it fails on. A ``map`` is a function
of one message: the executors read the lease and run it under the crash guard
(:mod:`poisonq.spark.transform`, :mod:`poisonq.worker.guard`), settle the failed messages and pass
the good rows on. Either way a permanent error dead-letters and any other error or a crash
abandons, so the queue's retry policy applies; when the job has written the batch, the
driver completes whatever the lease still holds, in one statement.

Output is idempotent per lease and never shared between consumers: the rule every sink keeps
is stated in :mod:`poisonq.spark.sink` (files: ``<output>/consumer=<name>/lease=<n>``, in
overwrite mode, the messages completed only afterwards).

A defect is not poison (:mod:`poisonq.defects`). When most of a task's messages fail the
same way, the task fails the job with the defect before anything is settled or written; a
job that fails as a whole is isolated by :mod:`poisonq.spark.batch_writer`, which writes each
batch; batches too small to show a defect alone are judged together here (:meth:`Pipeline._judge`).
The runner itself is the run loop (a store thread completing one batch and leasing the next
while a job runs) and the replay of what a dead run left.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

import poisonq
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, Defect, FailureWindow, check_ratio
from poisonq.errors import (
    EntityDisabledError,
    InvalidOptionError,
    MessageNotFoundError,
)
from poisonq.failures import first_line
from poisonq.limits import check_count
from poisonq.model import FailureRecord, Lease, MessageState
from poisonq.names import validate_name
from poisonq.spark.batch_sizes import BatchSizes
from poisonq.spark.batch_writer import BatchWriter
from poisonq.spark.batches import BatchFunction, BatchTransform
from poisonq.spark.expectations import check_expectations
from poisonq.spark.interrupts import interrupted_cleanly
from poisonq.spark.jobs import FrameJob, LeaseReader, MapJob, struct_of
from poisonq.spark.kinds import PYTHON, OfMessages, check_options
from poisonq.spark.lease_renewer import LeaseRenewer, taken_ahead
from poisonq.spark.reports import PipelineInterrupted, PipelineReport, PipelineStoppedError
from poisonq.spark.rows import OutputSchema
from poisonq.spark.session import quiet_query_errors
from poisonq.spark.sink import SinkFunction, sink_for
from poisonq.spark.source import absolute_url
from poisonq.spark.stores import open_existing
from poisonq.spark.transform import LeaseTransform, Work
from poisonq.timeline import DEFAULT_KEEP, BatchRun
from poisonq.worker.guard import Transform

log = logging.getLogger(__name__)
SMALL_BATCH = 1_000  # batches this small are also judged together for a defect (_judge)


class Pipeline:
    """Runs a transform over the messages of ``queue`` into ``output``, one lease per batch.

    ``transform(frame)`` takes the batch as a DataFrame (the columns of
    :data:`~poisonq.spark.MESSAGE_SCHEMA_DDL`, ``body`` as binary) and returns the output
    DataFrame, as Spark's ``DataFrame.transform`` does. Each output row must keep the
    ``sequence_number`` of the message it comes from: a message with no row is completed, one
    with several has all of them written, and the column is written with the rest. A row
    that fails one of ``expectations`` (name to a SQL boolean over the output row; false or
    NULL fails) dead-letters its message ``ExpectationFailed`` with none of its rows written;
    an exception in a :func:`poisonq.spark.udf` fails its row's message; anything else that
    fails the job (an ANSI cast, ``raise_error``, a plain UDF, a crash) is isolated by
    bisection.

    ``map(message)`` instead takes one message as a dict (``sequence_number``,
    ``message_id``, ``body`` as bytes, ``subject``, ``properties``, ``delivery_count``,
    ``enqueued_time``, ...) and returns one output row of ``schema`` (a Spark DDL string or
    ``StructType``): a dict or named ``Row`` with every field (extra keys are an error unless
    ``ignore_extra_fields``), or a tuple, list or ``Row`` by position; or ``None`` to
    complete the message without an output row. Anything else dead-letters the message with
    ``OutputSchemaMismatch`` (see :mod:`poisonq.spark.rows`). It runs on executors, under
    the crash guard unless ``isolate`` is false, so it must be picklable.

    ``output`` is a directory (each batch under ``consumer=<name>/lease=<n>`` in
    ``output_format``, Parquet unless given) or a function ``write(frame, batch)`` called
    with each batch's good rows and its number, as ``foreachBatch`` is; it must replace what
    it wrote for the same number before (see :class:`poisonq.spark.sink.FunctionSink`).

    ``map_batches(batch)`` takes an Arrow ``RecordBatch`` of messages and returns its rows
    of ``schema``, or ``(rows, errors)`` with one error (or ``None``) per message, the rows
    then tied to their messages by a ``sequence_number`` column or by place (one row a
    message) so that a failed message's rows are not written; an exception for the whole
    batch is traced to the messages that raise it alone, in the same worker (see
    :mod:`poisonq.spark.batches`).

    ``batch_size`` is the most messages a batch (one lease, one Spark job) takes of those
    ready; left out, 100,000 for a run's first batch and after a batch whose job failed, else
    1,000,000 (:mod:`poisonq.spark.batch_sizes` says why).

    ``permanent`` exception types dead-letter at once (in ``map``, ``map_batches`` and in
    poisonq UDFs).
    ``max_failure_ratio`` (``None``: never) is the share of a batch that may fail the same
    way before the runner calls it a defect and stops.

    Each batch is recorded in the consumer's timeline as its lease is completed (see
    :meth:`poisonq.Broker.pipeline_batches`); the store keeps the last ``keep_batches``.
    The driver's store operations are retried ``retry_total`` times over a store outage, as
    :func:`poisonq.connect` does.
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        url: str,
        queue: str,
        output: str | SinkFunction,
        transform: Callable[[DataFrame], DataFrame] | None = None,
        map: Transform | None = None,
        map_batches: BatchFunction | None = None,
        schema: str | StructType | None = None,
        expectations: Mapping[str, str] | None = None,
        consumer: str = "pipeline",
        batch_size: int | None = None,
        lock_duration: float | None = None,
        output_format: str | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        isolate: bool | None = None,
        ignore_extra_fields: bool = False,
        max_failure_ratio: float | None = DEFAULT_MAX_FAILURE_RATIO,
        keep_batches: int = DEFAULT_KEEP,
        retry_total: int = 3,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise InvalidOptionError("batch_size must be at least 1")
        if keep_batches < 1:
            raise InvalidOptionError("keep_batches must be at least 1")
        validate_name(consumer)
        self.spark = spark
        self.url = absolute_url(url)
        self.queue = queue
        sink = sink_for(spark, output, output_format, consumer)
        self.consumer = consumer
        self.batch_size = batch_size
        self.keep_batches = keep_batches
        check_count(retry_total, "retry_total", minimum=0)
        self.retry_total = retry_total
        self.lock_duration = lock_duration
        self.permanent = permanent
        self.max_failure_ratio = check_ratio(max_failure_ratio)
        self.expectations = check_expectations(expectations)
        given = [name for name, f in (("transform=", transform), ("map=", map),
                 ("map_batches=", map_batches)) if f is not None]  # fmt: skip
        if len(given) != 1:
            raise InvalidOptionError(
                "give a pipeline one of transform= (a function from the batch's DataFrame to"
                " the output DataFrame), map= (a function of one message) or map_batches= (a"
                " function of an Arrow batch of messages), the last two with schema="
                + (f"; given {' and '.join(given)}" if given else "")
            )
        kind = OfMessages.MAP if map is not None else OfMessages.MAP_BATCHES
        check_options(
            PYTHON,
            of_messages=None if transform is not None else kind,
            schema=schema is not None,
            expectations=bool(self.expectations),
            ignore_extra_fields=ignore_extra_fields,
            isolate=isolate is not None,
        )
        lease_reader = LeaseReader(spark, self.url, queue, consumer)
        self._job: MapJob | FrameJob
        if transform is None:
            assert schema is not None
            rows = OutputSchema(struct_of(schema), ignore_extra_fields)
            guard, ratio = isolate is not False, self.max_failure_ratio
            work: Work
            if map is not None:
                work = LeaseTransform(rows, permanent, guard, ratio, map)
            else:
                assert map_batches is not None
                work = BatchTransform(rows, permanent, guard, ratio, map_batches)
            self._job = MapJob(lease_reader, work)
        else:
            self._job = FrameJob(
                lease_reader, transform, self.expectations, permanent, self.max_failure_ratio
            )
        self.writer = BatchWriter(queue, self._job, sink)

    def run(
        self,
        until_idle: bool = True,
        max_batches: int | None = None,
        progress: Callable[[PipelineReport], None] | None = None,
    ) -> PipelineReport:
        """Process leases until the queue is idle (or ``max_batches`` were run). Leases left
        unfinished by an earlier run are replayed first.

        The store works beside the Spark jobs: while a batch's job runs, a thread completes
        the batch before it and leases the next one, so a batch costs its job and not the
        store's writes too. That is why a run may leave two leases unfinished when it dies,
        and why a restart replays both. A lease taken ahead that is not run (the run stops)
        is given back with no delivery counted. The next lease is taken ahead only when the
        queue holds a full first batch: when it holds less, the next lease waits for the
        job, so that it also carries what the job gives back to be retried (see
        :meth:`_acquire_ahead`).

        Ctrl-C raises :class:`PipelineInterrupted` (a :class:`KeyboardInterrupt`) with the
        report so far, once the run's jobs are cancelled (:mod:`poisonq.spark.interrupts`):
        the batch in hand is replayed by the next run."""
        report = PipelineReport()
        try:
            with interrupted_cleanly(self.spark):
                self._run(report, until_idle, max_batches, progress)
        except KeyboardInterrupt:
            raise PipelineInterrupted(report) from None
        return report

    def _run(
        self,
        report: PipelineReport,
        until_idle: bool,
        max_batches: int | None,
        progress: Callable[[PipelineReport], None] | None,
    ) -> None:
        started = time.monotonic()
        with open_existing(self.url, retry_total=self.retry_total) as broker:
            dead_before = _dead_letters(broker, self.queue)
            work = ThreadPoolExecutor(1, thread_name_prefix="poisonq-pipeline-store")
            ahead: Future[Lease | None] | None = None
            completing: Future[None] | None = None
            running: Lease | None = None  # its batch under way, not yet given to complete
            window = FailureWindow(self.max_failure_ratio)
            sizes = BatchSizes(self.batch_size)
            try:
                number = self._replay(broker, report, window)
                ahead = work.submit(self._acquire, broker, number + 1, sizes.first)
                while max_batches is None or report.batches < max_batches:
                    assert ahead is not None  # taken whenever another batch may run
                    lease = self._next(broker, ahead, number + 1, sizes.next(), report)
                    ahead = None
                    if lease is None:
                        if until_idle:
                            break
                        time.sleep(1.0)
                        ahead = work.submit(self._acquire, broker, number + 1, sizes.next())
                        continue
                    number = lease.number
                    if max_batches is None or report.batches + 1 < max_batches:
                        ahead = work.submit(
                            self._acquire_ahead, broker, number + 1, sizes.first, sizes.next()
                        )
                    running = lease
                    run = self._batch(broker, lease, report, window, ahead)
                    sizes.ran(run)
                    if completing is not None:
                        completing.result()  # the batch before, completed during this one
                    if _not_taken(ahead):  # now, ahead of this batch's completion and its writes
                        ahead = work.submit(self._acquire, broker, number + 1, sizes.next())
                    completing = work.submit(self._complete, broker, lease, report, run)
                    running = None
                    if progress is not None:
                        progress(self._tally(broker, report, dead_before, started))
                if completing is not None:
                    completing.result()
                    if progress is not None:  # the last batch, completed
                        progress(self._tally(broker, report, dead_before, started))
            finally:  # also in the report a PipelineStoppedError carries
                work.shutdown(wait=True)
                if (taken := taken_ahead(ahead)) is not None:
                    broker.release_lease(taken)  # leased ahead, never run, never counted
                if running is not None:
                    report.unfinished = len(broker.lease_sequence_numbers(running))
                self._tally(broker, report, dead_before, started)

    def _tally(
        self,
        broker: poisonq.Broker,
        report: PipelineReport,
        dead_before: Counter[str],
        started: float,
    ) -> PipelineReport:
        """The report's counts that come from the store: dead-lettered by reason (this
        run's, including what expired before it could be leased), and so what was retried."""
        report.dead_lettered = _dead_letters(broker, self.queue) - dead_before
        settled = report.completed + report.dead_lettered.total() + report.released
        report.retried = max(0, report.leased - settled - report.unfinished)
        report.elapsed = time.monotonic() - started
        return report

    def _replay(self, broker: poisonq.Broker, report: PipelineReport, window: FailureWindow) -> int:
        """Finish the leases an earlier run left (the last two: one may have been leased
        ahead); returns the number of the latest lease (0: none yet)."""
        latest = broker.lease(self.queue, self.consumer)
        if latest is None:
            return 0
        before = broker.lease(self.queue, self.consumer, latest.number - 1)
        for lease in (before, latest):
            if lease is None:
                continue
            if held := broker.lease_sequence_numbers(lease):
                self._wait_for_its_run(broker, lease, held[0], report)
            # Renewed for a whole lock before its batch runs: the dead run's lock may be
            # nearly out, and the renewer's first renewal is a third of a lock away. A lock
            # that ran out while this run watched it is revived, nothing having read its
            # messages since; the batch counts as what the lease still holds.
            if count := broker.resume_lease(lease, self.lock_duration):
                replayed = dataclasses.replace(lease, count=count)
                run = self._batch(broker, replayed, report, window)
                self._complete(broker, replayed, report, run)
            elif lease.completed_at is None:
                # Its locks ran out before it was completed and its messages were taken
                # back: whatever it wrote is an orphan, and they come again in a later lease.
                self._discard_output(lease, report)
        return latest.number

    def _wait_for_its_run(
        self, broker: poisonq.Broker, lease: Lease, seq: int, report: PipelineReport
    ) -> None:
        """A lease still locked belongs to a run that died less than a lock ago, or to one
        that is still going (the same consumer started twice): replaying it then would
        overwrite that run's output. A live run renews its lease every third of the lock,
        so watch the lock for half of it: renewed, or the lease completed, meanwhile, and
        the consumer is busy, so this run stops; else the run that held it is gone, and
        the lease is replayed (or, its lock run out, given up)."""
        seconds = self.lock_duration or broker.get_queue(self.queue).options.lock_duration
        first = self._lock_end(broker, seq)
        if first is None:
            return
        log.warning(
            "lease %d of consumer %r is still locked: making sure no other run holds it"
            " (up to %.0f s)",
            lease.number, self.consumer, seconds / 2,
        )  # fmt: skip
        deadline = time.monotonic() + seconds / 2
        while time.monotonic() < deadline:
            time.sleep(min(0.5, seconds / 20))
            if time.time() >= first:
                return  # its lock ran out unrenewed: read no message, so it can be revived
            now = broker.lease(self.queue, self.consumer, lease.number)
            end = self._lock_end(broker, seq)
            if (now is not None and now.completed_at is not None) or (end or 0) > first:
                raise PipelineStoppedError(
                    report,
                    f"consumer {self.consumer!r} is being run by another process (its lease"
                    f" {lease.number} was renewed or completed while this run waited):"
                    " give each instance its own consumer name (--consumer)",
                )
            if end is None:
                return  # its lock ran out

    def _lock_end(self, broker: poisonq.Broker, seq: int) -> float | None:
        """When the lock on message ``seq`` runs out, if it is still locked."""
        try:
            message = broker.message(self.queue, seq)
        except MessageNotFoundError:
            return None
        until = message.locked_until
        if message.state is not MessageState.LOCKED or until is None:
            return None
        return until.timestamp() if until.timestamp() > time.time() else None

    def _acquire(self, broker: poisonq.Broker, number: int, size: int) -> Lease | None:
        """Lease ``number`` of up to ``size`` messages, and what its batch needs to know
        from the store before it runs (:meth:`BatchWriter.look_ahead`): the run loop calls
        this in its store thread."""
        lease = broker.acquire_lease(self.queue, self.consumer, number, size, self.lock_duration)
        if lease is not None:
            self.writer.look_ahead(broker, lease)
        return lease

    def _acquire_ahead(
        self, broker: poisonq.Broker, number: int, full: int, size: int
    ) -> Lease | None:
        """Lease ``number`` of up to ``size`` messages while the batch before it runs, if the
        queue holds a full batch (``full``, a run's first batch's size) for it; else ``None``,
        and the run loop takes it once that batch's job is done (:func:`_not_taken`).

        A message the job gives back (a crash, an error retried) is ready again only when
        its partition is settled, after a lease taken at the job's start: taken ahead, a
        lease that is not full anyway would leave those messages to a batch of their own,
        each such batch a Spark job's fixed cost for a handful of messages. Waiting folds
        them in: at the end of a run the redeliveries of the last batches come in one
        batch per delivery left, not one per batch they came from. A full batch is still
        taken ahead (what the job gives back then goes in the batch after it, which may
        be theirs alone when a lease of up to 1,000,000 took the rest of the queue)."""
        ready = broker.get_queue(self.queue).receivable
        return self._acquire(broker, number, size) if ready >= full else None

    def _next(
        self,
        broker: poisonq.Broker,
        ahead: Future[Lease | None],
        number: int,
        size: int,
        report: PipelineReport,
    ) -> Lease | None:
        """Lease ``number``, taken ahead (else now, of up to ``size``); or
        :class:`PipelineStoppedError` if the queue stopped delivering."""
        try:
            lease = ahead.result()
            if lease is None and report.batches:
                # Not taken while the batch before ran (:meth:`_acquire_ahead`), or taken
                # before what that batch gave back to retry was there.
                lease = self._acquire(broker, number, size)
            return lease
        except EntityDisabledError as exc:
            raise PipelineStoppedError(report, f"stopped: {exc}", cause=exc) from exc

    def _batch(
        self,
        broker: poisonq.Broker,
        lease: Lease,
        report: PipelineReport,
        window: FailureWindow,
        ahead: Future[Lease | None] | None = None,
    ) -> BatchRun:
        """One lease's output, its locks (and those of the lease taken ``ahead``) renewed
        meanwhile; returns its job's run, for the timeline. A small batch is then judged
        with the ones before it (:meth:`_judge`)."""
        report.batches += 1
        report.leased += lease.count
        small = lease.count <= SMALL_BATCH
        fresh = broker.lease_sequence_numbers(lease, first_delivery=True) if small else []
        jobs, started = report.isolation_jobs, time.time()
        with LeaseRenewer(broker, lease, self.lock_duration, ahead):
            self.writer.write(broker, lease, report)
        seconds, jobs = time.time() - started, report.isolation_jobs - jobs
        run = BatchRun(started, seconds, jobs, self.keep_batches)
        defect = self._judge(broker, lease, fresh, window) if small else None
        if defect is not None:
            self._complete(broker, lease, report, run)  # its output is written
            self._stop_across(broker, lease, defect, report)
        return run

    def _complete(
        self, broker: poisonq.Broker, lease: Lease, report: PipelineReport, run: BatchRun
    ) -> None:
        """Complete what the lease still holds, once its output is written, and record the
        batch in the consumer's timeline in the same transaction (off the batch's critical
        path: :meth:`run` does this in its store thread while the next job runs)."""
        report.completed += broker.complete_lease(lease, run)

    def _judge(
        self, broker: poisonq.Broker, lease: Lease, fresh: list[int], window: FailureWindow
    ) -> Defect | None:
        """Whether small batches, judged together, show a defect. A task sees a defect only
        among :data:`~poisonq.defects.MIN_FAILURES` failures of its own, which a batch of a
        few messages never has; so after each small batch the runner adds what became of
        its first deliveries (those the lease no longer holds failed) to a window across
        batches, as the Processor does, and stops when a run of failures shows a defect."""
        held = set(broker.lease_sequence_numbers(lease))
        failures = _last_failures(broker, self.queue, [seq for seq in fresh if seq not in held])
        defect = window.add(  # in order: a span of failures starts at its first
            None if seq in held else failures[seq] for seq in fresh
        )
        if defect is None and not window.undecided():
            window.settled()  # successes outnumber the failures: poison, if anything
        return defect

    def _stop_across(
        self, broker: poisonq.Broker, lease: Lease, defect: Defect, report: PipelineReport
    ) -> None:
        fingerprint = defect.failure.fingerprint or None
        dead = broker.count_dead_letters(self.queue, fingerprint=fingerprint) if fingerprint else 0
        after = (
            "the dead-lettered ones can be resubmitted once it is fixed (poisonq dlq resubmit"
            f" {self.queue} --fingerprint {fingerprint})"
            if dead
            else "they are back in the queue, a delivery counted, and come again when it runs"
        )
        message = (
            f"stopped after lease {lease.number}: {defect}, over the last batches (each too"
            f" small to tell alone); the {defect.failed} failed messages were settled before it"
            f" showed: {after}"
        )
        raise PipelineStoppedError(report, message, defect=defect)

    def _discard_output(self, lease: Lease, report: PipelineReport) -> None:
        """Overwrite a lease's output with nothing (with Spark, so on any file system)."""
        log.warning("lease %d was never completed: discarding its output", lease.number)
        try:
            with quiet_query_errors():
                self.writer.sink.discard(lease, self._job.struct)
        except Exception as exc:  # the sink: a path that cannot be written, a format...
            first = first_line(exc)
            raise PipelineStoppedError(
                report, f"cannot write the output of lease {lease.number}: {first}"
            ) from exc


def _not_taken(ahead: Future[Lease | None] | None) -> bool:
    """Whether the next lease was not taken while the batch ran (:meth:`Pipeline._acquire_ahead`
    found less than a full batch): then the run loop takes it as soon as the batch is done,
    before the store thread completes the batch, whose writes it would otherwise wait for
    (on SQLite, deleting a batch of 100,000 takes a few tenths of a second)."""
    return ahead is not None and ahead.done() and not ahead.exception() and not ahead.result()


def _last_failures(broker: poisonq.Broker, queue: str, seqs: list[int]) -> dict[int, FailureRecord]:
    """The failure each of ``seqs`` settled with (abandoned: in the queue; or dead-lettered),
    read with one peek of each over their range (a small batch's)."""
    found: dict[int, FailureRecord] = {
        seq: FailureRecord(time.time(), "Unknown", f"message {seq}", fingerprint=f"seq-{seq}")
        for seq in seqs
    }
    if seqs:
        lo, hi = min(seqs), max(seqs)
        for address in (queue, f"{queue}/$deadletterqueue"):
            for message in broker.peek(address, from_sequence=lo, max_messages=hi - lo + 1):
                if message.sequence_number in found and message.failures:
                    found[message.sequence_number] = message.failures[-1]
    return found


def _dead_letters(broker: poisonq.Broker, queue: str) -> Counter[str]:
    return Counter({g.key or "": g.count for g in broker.dead_letter_groups(queue, "reason")})
