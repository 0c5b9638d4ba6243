"""Writing one lease's output, and isolating the messages that fail its Spark job.

A batch is one Spark job through the pipeline's job (:mod:`poisonq.spark.jobs`) into its sink
(:mod:`poisonq.spark.sink`). When the job fails as a whole (an ANSI cast error,
``raise_error``, a plain UDF that raises, the sink, a crash the guard cannot see) and the
first and last messages of the batch each fail the same way alone, the job is broken, not a
message: the lease is released (no delivery counted) and :class:`PipelineStoppedError` says
why. Otherwise the failed batch is bisected into smaller jobs by sequence range (over its
input read once) until the messages whose jobs fail alone are found; only they are settled,
each by its own job's error (dead-lettered at once for a data error, else abandoned), and
the batch runs again without them. A message that failed a job alone before runs alone
before its next batch.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping

from pyspark.sql import DataFrame

import poisonq
from poisonq.defects import Defect
from poisonq.errors import InvalidOptionError
from poisonq.failures import failure_from_exception, first_line
from poisonq.model import Lease
from poisonq.spark.gate import Runs, leaked
from poisonq.spark.isolation import (
    JOB_FAILURE_FINGERPRINTS,
    MAX_GUILTY_PER_BATCH,
    JobError,
    Probe,
    isolate,
    isolated_settlement,
    job_defect,
    job_failure,
    report_isolated,
    same_job_failure,
)
from poisonq.spark.jobs import FrameJob, MapJob
from poisonq.spark.reports import PipelineReport, PipelineStoppedError
from poisonq.spark.session import quiet_query_errors
from poisonq.spark.settling import defect_in
from poisonq.spark.sink import Sink, SinkFailed

log = logging.getLogger(__name__)
MAX_REWRITES = 5
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named (\S+)")


class BatchWriter:
    """Writes a lease's batch of ``queue`` through ``job`` into ``sink`` (see the module
    docstring)."""

    def __init__(self, queue: str, job: MapJob | FrameJob, sink: Sink) -> None:
        self.queue = queue
        self._job = job
        self.sink = sink
        self._returning: dict[int, dict[int, str]] = {}  # by lease number: see look_ahead

    def write(self, broker: poisonq.Broker, lease: Lease, report: PipelineReport) -> None:
        """Write the lease's output, isolating guilty messages if the job fails."""
        with quiet_query_errors():
            self._suspects_first(broker, lease, report)
            attempt = 0
            while True:
                try:
                    self._write_batch(broker, lease)
                    return
                except JobError as exc:
                    if self._job.guard_after(exc):
                        log.warning(
                            "a Python worker died in batch %d: writing it again with the"
                            " crash guard on, as every batch of this run from now on",
                            lease.number,
                        )
                        continue
                    defect = defect_in(exc)
                    if defect is None and attempt == 2:  # two rounds of isolation did not do
                        defect = job_defect(exc, broker.lease_sequence_numbers(lease))
                    elif defect is None:
                        why = job_failure(exc).message
                        log.warning("batch %d failed as a whole; isolating: %s", lease.number, why)
                        defect = self._isolate(broker, lease, exc, report)
                    if defect is not None:
                        self._stop(broker, lease, defect, report)
                    attempt += 1
                except InvalidOptionError:  # the transform went wrong on the driver
                    broker.release_lease(lease)
                    raise
                except SinkFailed as exc:
                    failure = failure_from_exception(exc.error, time.time())
                    held = len(broker.lease_sequence_numbers(lease))
                    self._stop(broker, lease, Defect(failure, held, held), report)

    def _stop(
        self,
        broker: poisonq.Broker,
        lease: Lease,
        defect: Defect,
        report: PipelineReport,
    ) -> None:
        """Give the lease back (no delivery counted), write its output as nothing, and stop
        with the defect (``run`` fills in the report's dead-letter counts and time)."""
        released = broker.release_lease(lease)
        self._write_nothing(lease)
        report.released += released
        message = (
            f"stopped at lease {lease.number}: {defect}; {released} message(s) given back"
            " to the queue without a delivery counted, nothing written for the batch"
        )
        missing = _MISSING_MODULE.search(f"{defect.failure.error_type}: {defect.failure.message}")
        if missing is not None:
            message += (
                f". The job's Python workers cannot import {missing.group(1)}: they run the"
                " interpreter PYSPARK_PYTHON names (python3 from PATH by default); set it to"
                f" one that has it (this driver's is {sys.executable}) before the session starts"
            )
        raise PipelineStoppedError(report, message, defect=defect) from None

    def _write_nothing(self, lease: Lease) -> None:
        """Replace the output of a lease the run stops at with nothing of the schema: its
        failed job may have left an empty directory, which Spark cannot read (it has no
        schema to infer) and which would be all the output of a run stopped at its first
        batch. A sink that cannot be written (the reason the run stops, perhaps) is left."""
        try:
            self.sink.discard(lease, self._job.struct)
        except (*JobError, SinkFailed) as exc:
            why = first_line(exc)
            log.warning("could not write lease %d's output as nothing: %s", lease.number, why)

    def write_once(
        self,
        lease: Lease,
        span: tuple[int, int] | None = None,
        source: DataFrame | None = None,
    ) -> Runs:
        """The batch's one Spark job: read the lease (or ``source``, its input read once)
        through the transform, write it to the sink (a ``span`` of it, an isolation job's
        part, aside). Returns the runs of sequence numbers the gates of a ``transform``
        passed (none for ``map``, whose rows are settled where they are made)."""
        frame, passed = self._job.frame(lease, span, source)
        if span is None:
            self.sink.write(frame, lease)
        else:
            self.sink.write_aside(frame)
        return passed.value if passed is not None else []

    def _write_batch(self, broker: poisonq.Broker, lease: Lease) -> None:
        """Write the lease's batch; again if a message that failed in one partition had a
        row passed by another (see :mod:`poisonq.spark.gate`): its messages are read again
        without the failed ones. Each round has one failed message more to leave out."""
        for _ in range(MAX_REWRITES):
            passed = self.write_once(lease)
            if not passed or not leaked(passed, broker.lease_sequence_numbers(lease)):
                return
            log.warning("lease %d: a failed message had rows written; writing again", lease.number)

    def _isolate(
        self, broker: poisonq.Broker, lease: Lease, error: BaseException, report: PipelineReport
    ) -> Defect | None:
        """Find and settle the messages whose jobs fail alone, over the batch's input read
        once (:meth:`FrameJob.read_once`) and writing the parts aside
        (:func:`~poisonq.spark.isolation.isolate`); the defect if the batch shows one
        instead."""
        held = broker.lease_sequence_numbers(lease)
        fresh = broker.lease_sequence_numbers(lease, first_delivery=True)
        source = self._job.read_once(lease)
        try:
            found = isolate(held, fresh, error, self._prober(lease, report, source))
        finally:
            if source is not None:
                source.unpersist()
        if isinstance(found, Defect):
            return found
        self._settle_isolated(broker, lease, found)
        return None

    def look_ahead(self, broker: poisonq.Broker, lease: Lease) -> None:
        """Find the messages of a lease that failed a Spark job alone before, ahead of its
        batch: the runner's store thread calls this as it takes the next lease, while a job
        runs, so that a batch does not start by waiting for the store (whose connection that
        thread is using to complete the batch before)."""
        self._returning = {lease.number: self._returning_of(broker, lease)}

    def _returning_of(self, broker: poisonq.Broker, lease: Lease) -> dict[int, str]:
        """The lease's messages that failed a Spark job alone on an earlier delivery, with
        that failure's fingerprint. None for a lease of nothing but such messages: its own
        batch is as small."""
        fresh = set(broker.lease_sequence_numbers(lease, first_delivery=True))
        if not fresh or len(fresh) == lease.count:
            return {}
        returning = [seq for seq in broker.lease_sequence_numbers(lease) if seq not in fresh]
        before: dict[int, str] = {}
        for seq in returning[:MAX_GUILTY_PER_BATCH]:
            failures = broker.message(self.queue, seq).failures
            if failures and failures[-1].fingerprint.startswith(JOB_FAILURE_FINGERPRINTS):
                before[seq] = failures[-1].fingerprint
        return before

    def _suspects_first(self, broker: poisonq.Broker, lease: Lease, report: PipelineReport) -> None:
        """Run alone, before their batch, the messages of the lease that failed a Spark job
        alone on an earlier delivery, and settle those that fail the same way again: poison
        coming back then costs one small job, not its whole batch failing again and a round
        of isolation. One failing another way stays in the batch, whose failure is judged
        as any (a broken sink is a defect, not the fault of the message that met it first)."""
        before = self._returning.pop(lease.number, None)
        if before is None:  # a lease not taken ahead (a replay)
            before = self._returning_of(broker, lease)
        if not before:
            return
        fails = self._prober(lease, report, None)
        found = {
            seq: error
            for seq, fingerprint in before.items()
            if (error := fails([seq])) is not None
            and same_job_failure(fingerprint, job_failure(error).fingerprint)
        }
        self._settle_isolated(broker, lease, found)

    def _prober(self, lease: Lease, report: PipelineReport, source: DataFrame | None) -> Probe:
        """Runs a part of the lease (from ``source`` if given, else the store), written
        aside: None if it passed, else its error; counted as an isolation job."""

        def fails(part: list[int]) -> BaseException | None:
            report.isolation_jobs += 1
            try:
                self.write_once(lease, (part[0], part[-1]), source)
                return None
            except JobError as exc:
                return exc

        return fails

    def _settle_isolated(
        self, broker: poisonq.Broker, lease: Lease, found: Mapping[int, BaseException]
    ) -> None:
        """Settle the messages found failing alone, each by its own error, in one
        transaction (:func:`~poisonq.spark.isolation.isolated_settlement`)."""
        if not found:
            return
        token = lease.lock_token
        permanent = self._job.permanent
        settlements = [
            isolated_settlement(s, token, e, job_failure(e), permanent) for s, e in found.items()
        ]
        broker.settle_held(self.queue, settlements)
        report_isolated(f"batch {lease.number}", settlements)
