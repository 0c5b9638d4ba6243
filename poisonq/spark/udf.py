"""``poisonq.spark.udf``: a Python UDF whose exception fails its row's message, not the task.

A plain Python UDF that raises fails its Spark task, and with it the whole batch; the runner
then has to bisect the batch to find the message. A poisonq UDF catches the exception per
row instead, returns NULL for it, and settles the row's message itself: a
:class:`~poisonq.errors.PermanentError` (or a type listed as permanent) dead-letters it, any
other error abandons it so the retry policy applies, each with type, message, traceback and
fingerprint in its failure history. A value that does not fit the declared type is
dead-lettered ``OutputSchemaMismatch``, as in ``map``.

To know the message, the UDF takes the row's ``sequence_number`` as a hidden first argument,
and the lease it settles under from the context a pipeline or the streaming helper sets
while it builds the batch's DataFrame (:func:`settling`). Built outside such a context (a
unit test of a transform), it is a plain Python UDF. It runs as an Arrow UDF over batches of
rows, so failures are settled once per batch, in one transaction, before the batch's values
go on: whatever comes after in the plan (the gate that writes the output) already sees the
message as settled and drops its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import DataType, StructField, StructType, _parse_datatype_string

from poisonq.failures import dead_lettering
from poisonq.spark.rows import OutputSchema
from poisonq.spark.settling import Failure, LeaseContext
from poisonq.spark.source import SEQUENCE
from poisonq.spark.stores import open_existing
from poisonq.worker.guard import Failed, apply

_CURRENT: ContextVar[LeaseContext | None] = ContextVar("poisonq_lease", default=None)


@contextmanager
def settling(context: LeaseContext) -> Iterator[None]:
    """Within this block, poisonq UDFs settle under ``context``'s lease."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> LeaseContext | None:
    """The lease poisonq UDFs (and :func:`poisonq.spark.dead_letter`) settle under here."""
    return _CURRENT.get()


def udf(
    fn: Callable[..., Any],
    returnType: DataType | str,
    *,
    permanent: tuple[type[BaseException], ...] = (),
) -> PoisonUDF:
    """A Python UDF over ``fn`` whose exceptions fail the row's message instead of the task
    (see the module docstring). ``permanent`` types dead-letter at once, as do the
    pipeline's own. Use it as any UDF: ``parse = udf(parse_order, "struct<...>")``, then
    ``df.select("sequence_number", parse("body").alias("order"))``; the DataFrame it is
    applied to must have the ``sequence_number`` column of the messages."""
    if not callable(fn):
        raise TypeError(f"poisonq.spark.udf takes a function, not {type(fn).__name__}")
    return PoisonUDF(fn, returnType, permanent)


class PoisonUDF:
    """What :func:`udf` returns: call it with columns (or column names) for a Column."""

    def __init__(
        self,
        fn: Callable[..., Any],
        kind: DataType | str,
        permanent: tuple[type[BaseException], ...],
    ) -> None:
        self.fn = fn
        self.returnType = kind  # a DDL string is parsed when applied: that needs a session
        self.permanent = permanent
        self.__name__ = getattr(fn, "__name__", "udf")

    def __call__(self, *columns: Column | str) -> Column:
        context = _CURRENT.get()
        if context is None:
            return F.udf(self.fn, self.returnType, useArrow=False)(*columns)
        kind = self.returnType
        rows = _Rows(
            self.fn,
            _parse_datatype_string(kind) if isinstance(kind, str) else kind,
            context,
            self.permanent,
        )

        def named(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            return rows.run(batches)  # Spark tells an iterator UDF by these type hints

        named.__name__ = self.__name__  # the column's name, as for a plain UDF
        arrow: Any = arrow_udf(named, self.returnType)  # type: ignore[call-overload]
        column: Column = arrow(F.col(SEQUENCE), *columns)
        return column


class _Rows:
    """The executor side: ``fn`` over each row of each Arrow batch, failures settled."""

    def __init__(
        self,
        fn: Callable[..., Any],
        kind: DataType,
        context: LeaseContext,
        permanent: tuple[type[BaseException], ...],
    ) -> None:
        self.fn = fn
        self.context = context
        self.permanent = (*context.permanent, *permanent)
        self.output = OutputSchema(StructType([StructField("value", kind)]))

    def run(self, batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        """The values of each batch of rows; failures settled before the batch goes on."""
        for arrays in batches:
            seqs, *args = arrays if isinstance(arrays, (tuple, list)) else (arrays,)
            yield self._batch(seqs.to_pylist(), [a.to_pylist() for a in args])

    def _batch(self, seqs: list[int], args: list[list[Any]]) -> pa.Array:
        fn = self.fn
        token = self.context.lease.lock_token
        failures: list[Failure] = []
        fitted: list[int] = []  # the rows with a value, and their values
        values: list[tuple[Any]] = []
        rows = zip(*args, strict=True) if args else [()] * len(seqs)
        for index, (seq, row) in enumerate(zip(seqs, rows, strict=True)):
            result = apply(lambda values: fn(*values), row, self.permanent)
            if type(result) is Failed:
                failures.append(self.context.failure(seq, result.failure, result.permanent))
            else:
                fitted.append(index)
                values.append((result,))
        batch, unfit = self.output.batch(values)
        failures += [dead_lettering(seqs[fitted[i]], token, failure) for i, failure in unfit]
        if failures:
            with open_existing(self.context.url) as broker:
                self.context.settle(broker, failures, seqs)
        # The values that fitted, in place; NULL where a row failed.
        bad = {i for i, _ in unfit}
        kept = iter(range(batch.num_rows))
        positions: list[int | None] = [None] * len(seqs)
        for i, index in enumerate(fitted):
            if i not in bad:
                positions[index] = next(kept)
        return batch.column(0).take(pa.array(positions, pa.int64()))
