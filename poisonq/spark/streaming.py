"""``poisonq.spark.foreach_batch``: a ``foreachBatch`` function that survives poison rows.

A plain ``foreachBatch`` function that raises on one bad row kills the query; restarted, it
replays the batch, and the source has to narrow the replay over several restarts
(:mod:`poisonq.spark.source`). :func:`foreach_batch` handles the failure in the same call
instead: it runs the user's handler again on parts of the batch by sequence range
(:func:`poisonq.spark.isolation.isolate`) until the messages that fail alone are found,
abandons them with the handler's error (dead-letters them for a
:class:`~poisonq.errors.PermanentError` or a ``permanent`` type), so the queue's retry policy
applies, and returns: the query goes on, and the messages of the parts that passed are
completed with the lease, at once (a plain query's batch is completed when Spark plans the
next one, so the last batch of a query that stops waits for the next run). A batch that
fails like a defect (its first and last first deliveries each fail alone the same way, or
too many fail alone) is not poison: what parts
wrote is completed, the rest is given back without a delivery counted, and
:class:`~poisonq.spark.PipelineStoppedError` stops the query.

The wrapper finds the batch's lease with no options of its own: the source tags the
``sequence_number`` column with its store, queue and consumer
(:func:`~poisonq.spark.source.store_tag`), and the batch's lease is the consumer's latest,
because Spark plans (and so leases) batch ``n + 1`` only after batch ``n`` committed. The
handler gets the batch without the tag (it names the store's URL, which files written from
the rows would keep). The driver renews the lease while the handler runs, however often.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import poisonq
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, Defect, check_ratio
from poisonq.errors import InvalidOptionError
from poisonq.failures import failure_from_exception
from poisonq.model import Complete, DeadLetter, FailureRecord, Lease
from poisonq.spark.expectations import FAILED, check_expectations, with_failed
from poisonq.spark.gate import gated
from poisonq.spark.isolation import (
    JobError,
    isolate,
    isolated_settlement,
    job_failure,
    report_isolated,
)
from poisonq.spark.lease_renewer import LeaseRenewer
from poisonq.spark.reports import PipelineReport, PipelineStoppedError
from poisonq.spark.session import quiet_query_errors
from poisonq.spark.settling import LeaseContext, defect_in
from poisonq.spark.source import SEQUENCE, store_tag, untagged
from poisonq.spark.stores import open_existing
from poisonq.spark.udf import current, settling

Handler = Callable[[DataFrame, int], None]


def foreach_batch(
    handler: Handler,
    expectations: Mapping[str, str] | None = None,
    *,
    permanent: tuple[type[BaseException], ...] = (),
    max_failure_ratio: float | None = DEFAULT_MAX_FAILURE_RATIO,
) -> ForeachBatch:
    """Wrap ``handler(df, batch_id)`` for ``writeStream.foreachBatch`` on a stream of
    ``spark.readStream.format("poisonq")``.

    - ``expectations`` (name to a SQL boolean over the batch's rows; false or NULL fails):
      the messages of failing rows are dead-lettered ``ExpectationFailed`` before the handler
      runs, and the handler gets only the other rows.
    - The handler runs under the batch's lease: a :func:`poisonq.spark.udf` in it settles the
      message of a row it fails on (its value is NULL: filter those rows out before writing),
      and :func:`dead_letter` dead-letters rows the handler rejects.
    - If the handler raises, it is called again on parts of the batch (see the module
      docstring): only the messages that fail alone are abandoned (or dead-lettered when
      the error is a ``PermanentError`` or one of ``permanent``), and the query goes on.

    **Idempotency.** The handler may be called several times for one batch id, on parts of
    the batch, and every call that returns counts as done: each message is in exactly one
    call that returned. So a call that raises must leave nothing behind. A handler that
    writes once per call with Spark's file commit protocol (``df.write.mode("append")
    .parquet(...)``, a Delta append) writes nothing when its job fails. A handler that writes
    twice (two tables) or writes before it raises must make a repeated write harmless: key
    rows by ``sequence_number`` and ``MERGE``, or overwrite a partition named by
    ``(batch_id, first sequence number of the call)``.

    **After a kill** between a call's write and the batch's completion, the restarted query
    replays the batch with the same batch id and lease, whole (this wrapper keeps the source
    from narrowing it, :meth:`~poisonq.Broker.reset_lease_plans`), its locks revived if they
    ran out while nothing received from the queue (:meth:`~poisonq.Broker.resume_lease`), so
    the replay's calls are the killed run's calls and the partition naming above overwrites
    what the killed run wrote. Take the first sequence number from the rows written if the
    handler settles rows itself, and write nothing for a call with no rows. If something
    else received from the queue between the kill and the restart, after the lock ran out,
    the messages it took back come in a later batch: only ``MERGE`` is safe then
    (docs/spark.md, "Streaming with foreach_batch": Idempotency, After a kill).
    """
    if not callable(handler):
        raise InvalidOptionError(
            f"foreach_batch takes a function (df, batch_id), not {type(handler).__name__}"
        )
    return ForeachBatch(
        handler, check_expectations(expectations), permanent, check_ratio(max_failure_ratio)
    )


class ForeachBatch:
    """What :func:`foreach_batch` returns: give it to ``writeStream.foreachBatch``."""

    def __init__(
        self,
        handler: Handler,
        expectations: dict[str, str],
        permanent: tuple[type[BaseException], ...],
        max_failure_ratio: float | None,
    ) -> None:
        self.handler = handler
        self.expectations = expectations
        self.permanent = permanent
        self.max_failure_ratio = max_failure_ratio

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        tag = store_tag(df)
        frame = untagged(df)
        with open_existing(tag.url) as broker:
            lease = broker.lease(tag.address, tag.consumer)
            if lease is None:  # an empty batch before the consumer's first lease
                self.handler(frame, batch_id)
                return
            # This wrapper isolates the batch's failures itself: if the query dies and
            # replays the batch, that is a restart's replay, to run whole, not narrowed.
            broker.reset_lease_plans(lease)
            context = LeaseContext(
                tag.url, tag.address, lease, self.permanent, self.max_failure_ratio
            )
            with LeaseRenewer(broker, lease, tag.lock_duration), quiet_query_errors():
                try:
                    frame = self._expect(frame, context)
                except JobError as exc:  # the gate's tasks found a defect, or the store failed
                    self._stop_on_defect(broker, lease, batch_id, exc)
                    raise
                try:
                    self._call(frame, batch_id, context)
                except Exception as exc:
                    self._stop_on_defect(broker, lease, batch_id, exc)
                    self._isolate(broker, context, frame, batch_id, exc)
            # Written: complete it now, not when Spark plans the next batch, which it never
            # does after the last one (a query stopping, trigger availableNow).
            broker.complete_lease(lease)

    def _expect(self, frame: DataFrame, context: LeaseContext) -> DataFrame:
        """Dead-letter the messages of rows failing an expectation (the pipeline's gate, in
        a job of its own); the rows that pass. Those are chosen again by the expectations,
        not by what the gate passed, so no accumulator is needed (nor a SparkContext: this
        runs over Spark Connect too)."""
        if not self.expectations:
            return frame
        gated(frame, self.expectations, context, None).write.format("noop").mode("overwrite").save()
        checked = with_failed(frame, self.expectations)
        return checked.filter(F.size(FAILED) == 0).drop(FAILED)

    def _call(self, frame: DataFrame, batch_id: int, context: LeaseContext) -> None:
        with settling(context):
            self.handler(frame, batch_id)

    def _isolate(
        self,
        broker: poisonq.Broker,
        context: LeaseContext,
        frame: DataFrame,
        batch_id: int,
        error: BaseException,
    ) -> None:
        """Call the handler on parts of the batch; settle the messages that fail alone.
        The batch is read once for all the calls: the first reads it from the store and
        Spark keeps it (memory, then disk) until the isolation ends, so a call costs the
        handler's work, not the store's read again."""
        lease = context.lease
        held = broker.lease_sequence_numbers(lease)
        fresh = broker.lease_sequence_numbers(lease, first_delivery=True)
        written: list[int] = []  # by calls that returned: never in a call again
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)

        def fails(part: list[int]) -> BaseException | None:
            rest = [seq for seq in part if seq not in written]
            if not rest:
                return None
            chosen = frame.filter(F.col(SEQUENCE).between(part[0], part[-1]))
            if len(rest) < len(part):
                chosen = chosen.filter(~F.col(SEQUENCE).isin(written))
            try:
                self._call(chosen, batch_id, context)
            except Exception as exc:
                return exc
            written.extend(rest)
            return None

        try:
            found = isolate(held, fresh, error, fails)
        finally:
            frame.unpersist()
        if isinstance(found, Defect):
            self._stop(broker, lease, batch_id, found, written)
            return
        records = {seq: _failure(exc) for seq, exc in found.items()}
        failures = [
            isolated_settlement(seq, lease.lock_token, exc, records[seq], self.permanent)
            for seq, exc in found.items()
        ]
        # What the parts wrote is completed in the transaction that settles the failures: a
        # kill between the two would replay the batch without its failures, whole, and
        # write in one call what the parts wrote under their own first sequence numbers.
        done = [Complete(seq, lease.lock_token) for seq in written]
        broker.settle_held(context.address, [*done, *failures])
        report_isolated(f"batch {batch_id}", failures)

    def _stop_on_defect(
        self, broker: poisonq.Broker, lease: Lease, batch_id: int, error: BaseException
    ) -> None:
        """Stop if ``error`` carries a defect that tasks found (:class:`DefectFound`)."""
        defect = defect_in(error)
        if defect is not None:
            self._stop(broker, lease, batch_id, defect, written=[])

    def _stop(
        self,
        broker: poisonq.Broker,
        lease: Lease,
        batch_id: int,
        defect: Defect,
        written: list[int],
    ) -> None:
        """Complete what calls wrote, give the rest back (no delivery counted), stop."""
        broker.settle_held(lease.entity, [Complete(seq, lease.lock_token) for seq in written])
        released = broker.release_lease(lease)
        report = PipelineReport(batches=1, leased=lease.count, completed=len(written))
        message = (
            f"stopped at batch {batch_id} (lease {lease.number}): {defect}; {released}"
            " message(s) given back to the queue without a delivery counted"
            + (f", {len(written)} written by parts that passed completed" if written else "")
        )
        raise PipelineStoppedError(report, message, defect=defect) from None


def _failure(error: BaseException) -> FailureRecord:
    """A Spark job's error as the pipeline records it; the handler's own with its traceback."""
    if isinstance(error, JobError):
        return job_failure(error)
    return failure_from_exception(error, time.time())


def dead_letter(df: DataFrame, reason: str, description: str | Column | None = None) -> int:
    """Dead-letter the messages of ``df``'s rows with ``reason``; returns how many.

    ``df`` needs the ``sequence_number`` column of the batch. ``description`` is a column
    (a Column, or the name of one of ``df``'s columns) or else a text, the same for every
    row. The executors settle each partition's messages in one transaction, under the lease
    of the batch: the one :func:`foreach_batch` runs the handler under, or else the latest
    lease of the consumer ``df``'s tag names (a plain ``foreachBatch`` function). Messages
    the lease no longer holds (settled already, or their lock ran out) are left out.
    """
    if not (isinstance(reason, str) and reason.strip()):
        raise InvalidOptionError(f"dead_letter needs a reason (text), not {reason!r}")
    if SEQUENCE not in df.columns:
        raise InvalidOptionError("dead_letter needs the sequence_number column of the batch")
    context = current() or _latest(df)
    if description is None:
        text: Column = F.lit(None)
    elif isinstance(description, Column):
        text = description
    else:
        text = F.col(description) if description in df.columns else F.lit(description)
    rows = df.select(F.col(SEQUENCE), text.cast("string").alias("description"))
    counts = rows.mapInArrow(_DeadLetterRows(context, reason), "dead_lettered long")
    return sum(row.dead_lettered for row in counts.collect())


def _latest(df: DataFrame) -> LeaseContext:
    tag = store_tag(df)
    with open_existing(tag.url) as broker:
        lease = broker.lease(tag.address, tag.consumer)
    if lease is None:
        raise InvalidOptionError(f"consumer {tag.consumer!r} has no lease on {tag.address!r}")
    return LeaseContext(tag.url, tag.address, lease)


class _DeadLetterRows:
    """The executor side of :func:`dead_letter`: one transaction per partition."""

    def __init__(self, context: LeaseContext, reason: str) -> None:
        self.context = context
        self.reason = reason

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        token = self.context.lease.lock_token
        found: dict[int, DeadLetter] = {}
        for batch in batches:
            columns: Any = batch.to_pydict()
            for seq, text in zip(columns[SEQUENCE], columns["description"], strict=True):
                found.setdefault(seq, DeadLetter(seq, token, self.reason, text))
        lost: list[int] = []
        if found:
            with open_existing(self.context.url) as broker:
                _, lost = broker.settle_held(self.context.address, list(found.values()))
        yield pa.RecordBatch.from_pydict({"dead_lettered": [len(found) - len(lost)]})
