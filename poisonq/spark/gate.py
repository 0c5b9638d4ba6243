"""The gate between a DataFrame transform and its sink: only rows of good messages pass.

A ``transform`` pipeline writes ``gate(transform(lease))``, in the same Spark job. The gate
is a ``mapInArrow`` step that takes a whole partition of output rows, dead-letters the
messages whose rows failed an expectation (:mod:`poisonq.spark.expectations`), in one
transaction, and passes on only the rows of messages the lease still holds: a message a
:func:`poisonq.spark.udf` settled upstream, or one with any failing row, writes none.

A message's rows in two partitions (a transform that shuffles) are judged by two gates that
cannot see each other, so each gate reports the sequence numbers it passed, as runs, in an
accumulator; the driver compares them with what the lease still holds after the job
(:func:`leaked`) and writes the batch again if a message that failed elsewhere got a row out.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql.types import StructField, StructType

from poisonq.model import DeadLetter
from poisonq.spark.expectations import FAILED, expectation_dead_letter, with_failed
from poisonq.spark.settling import LeaseContext
from poisonq.spark.source import SEQUENCE
from poisonq.spark.stores import open_existing

Runs = list[tuple[int, int]]


class RunsParam(AccumulatorParam[Runs]):
    """Accumulates runs of consecutive sequence numbers."""

    def zero(self, value: Runs) -> Runs:
        return []

    def addInPlace(self, value1: Runs, value2: Runs) -> Runs:
        value1.extend(value2)
        return value1


def gated(
    frame: DataFrame,
    expectations: Mapping[str, str],
    context: LeaseContext,
    passed: Accumulator[Runs] | None,
) -> DataFrame:
    """``frame`` through the gate of ``context``'s lease, its rows checked against
    ``expectations``; the runs of sequence numbers passed go to ``passed``, if given (an
    accumulator needs a SparkContext, which Spark Connect has not). Spark's
    ``mapInArrow`` cannot resolve a column whose name has a dot (an unnamed
    ``get_json_object(body, '$.n')``), so the gate sees the columns by position."""
    names = frame.columns
    positional = [f"_{index}" for index in range(len(names))]
    checked = with_failed(frame, expectations).toDF(*positional, FAILED)
    fields = zip(frame.schema, positional, strict=True)
    schema = StructType([StructField(p, f.dataType, f.nullable) for f, p in fields])
    return checked.mapInArrow(Gate(context, passed, names), schema).toDF(*names)


class Gate:
    """The ``mapInArrow`` function: see the module docstring."""

    def __init__(
        self, context: LeaseContext, passed: Accumulator[Runs] | None, names: list[str]
    ) -> None:
        self.context = context
        self.passed = passed
        self.names = names  # of the columns, which the gate gets by position

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = [batch for batch in batches if batch.num_rows]
        if not received:
            return
        table = pa.Table.from_batches(received)
        seqs: list[int | None] = table.column(self.names.index(SEQUENCE)).to_pylist()
        lease = self.context.lease
        if None in seqs:
            raise ValueError("a row of the transform's output has no sequence_number")
        seen: list[int] = seqs  # type: ignore[assignment]
        lo, hi = min(seen), max(seen)
        if lo < lease.min_sequence or hi > lease.max_sequence:
            wrong = lo if lo < lease.min_sequence else hi
            raise ValueError(
                f"a row of the transform's output carries sequence_number {wrong}, which is no"
                f" message of this batch ({lease.min_sequence}..{lease.max_sequence}): keep the"
                " sequence_number of the message each row comes from"
            )
        failed = self._failed(table, seen)
        with open_existing(self.context.url) as broker:
            self.context.settle(broker, list(failed.values()), set(seen))
            held = set(broker.lease_sequence_numbers(lease, lo, hi))
        keep = [seq in held and seq not in failed for seq in seen]
        out = table.filter(pa.array(keep)).drop_columns([FAILED])
        if self.passed is not None:
            self.passed.add(runs(sorted({s for s, kept in zip(seen, keep, strict=True) if kept})))
        yield from out.to_batches()

    def _failed(self, table: pa.Table, seqs: list[int]) -> dict[int, DeadLetter]:
        """The dead-letterings of messages with a row that failed an expectation."""
        failed: dict[int, DeadLetter] = {}
        token = self.context.lease.lock_token
        for index, names in enumerate(table.column(FAILED).to_pylist()):
            seq = seqs[index]
            if names and seq not in failed:
                values = table.slice(index, 1).drop_columns([FAILED]).to_pylist()[0].values()
                row = dict(zip(self.names, values, strict=True))
                failed[seq] = expectation_dead_letter(seq, token, names, row)
        return failed


def runs(seqs: Sequence[int]) -> Runs:
    """Sorted distinct ``seqs`` as runs of consecutive numbers."""
    found: Runs = []
    for seq in seqs:
        if found and found[-1][1] == seq - 1:
            found[-1] = (found[-1][0], seq)
        else:
            found.append((seq, seq))
    return found


def leaked(passed: Runs, held: Sequence[int]) -> bool:
    """Whether a gate passed a row of a message the lease no longer holds (sorted ``held``):
    a message that failed in another partition."""
    return any(bisect_right(held, hi) - bisect_left(held, lo) != hi - lo + 1 for lo, hi in passed)
