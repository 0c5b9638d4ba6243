"""The executor side of ``map_batches=``: a function of an Arrow batch of messages.

Written for people who write ``mapInArrow`` and pandas UDFs: the function takes a
``pyarrow.RecordBatch`` of messages (the columns of :data:`~poisonq.spark.MESSAGE_SCHEMA_DDL`,
up to 10,000 rows) and returns its output rows in the pipeline's ``schema`` (a
``RecordBatch``, a ``Table``, or a pandas ``DataFrame``), any number of rows a message.
A message's failure is told in one of two ways:

- **returned**: ``(rows, errors)``, ``errors`` with one entry per input row, in order (a list
  or an Arrow array): ``None`` for a good message, else an exception (a
  :class:`~poisonq.PermanentError` or a ``permanent=`` type dead-letters, any other is
  retried) or a text (a rejection: dead-lettered, ``Rejected``). The rows of a failed message
  are the function's to leave out. This is the cheap way: a vectorized check costs nothing
  per good row.
- **raised**: an exception for the whole batch (``pyarrow.compute`` raising on one bad value)
  is traced to the messages that raise it alone, by calling the function again on halves of
  the batch, in the same worker, no Spark job: a few calls per bad message.

Output rows must have the schema's columns (extra ones are an error unless
``ignore_extra_fields``); each column is cast to its type safely (no overflow, no lost
fraction) and a ``NOT NULL`` field must have no null. A batch whose output does not fit
fails like an exception, and a message that does not fit alone is dead-lettered
``OutputSchemaMismatch``. A crash (a Python worker's death) switches the run to the crash
guard, which calls the function on one message at a time in a child process
(:mod:`poisonq.worker.guard`): slow, but only after a crash, and only for that run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from poisonq.errors import PermanentError
from poisonq.spark.schema import lease_batch
from poisonq.spark.settling import Failure
from poisonq.spark.work import FunctionWork, settlement
from poisonq.worker.guard import Crashed, Failed, run_isolated
from poisonq.worker.guard import failed as as_failed

BatchFunction = Callable[[pa.RecordBatch], Any]


class Rejected(PermanentError):
    """A message the batch function failed with a text instead of an exception."""


class OutputSchemaMismatch(PermanentError):
    """A batch function's rows that do not fit the pipeline's schema."""


@dataclass(frozen=True)
class OnLeaseBatch:
    """The batch function on one lease row, as the crash guard runs it: its result for a
    batch of that one message."""

    function: BatchFunction

    def __call__(self, row: tuple[Any, ...]) -> Any:
        return self.function(lease_batch([row]))


@dataclass(frozen=True)
class BatchTransform(FunctionWork):
    """What a ``map_batches`` pipeline runs on each chunk of a lease (picklable)."""

    transform: BatchFunction

    def apply(
        self, rows: list[tuple[Any, ...]], lock_token: str, failed: list[Failure]
    ) -> pa.RecordBatch:
        """The output rows of lease ``rows``; their failures are added to ``failed``."""
        settle = _Settler(lock_token, failed)
        pieces: list[pa.RecordBatch] = []
        if self.isolate:
            results = run_isolated(OnLeaseBatch(self.transform), rows, self.permanent)
            for row, result in zip(rows, results, strict=True):
                if type(result) is Failed or type(result) is Crashed:
                    settle.one(row[0], result)
                    continue
                try:
                    self._take(result, lease_batch([row]), pieces, settle)
                except OutputSchemaMismatch as exc:
                    settle.one(row[0], as_failed(exc, self.permanent))
        else:
            self._run(lease_batch(rows), pieces, settle)
        return self._concat(pieces)

    def _run(self, batch: pa.RecordBatch, pieces: list[pa.RecordBatch], settle: _Settler) -> None:
        """The function over ``batch``; on an exception, over each half of it, down to the
        messages that raise alone."""
        try:
            result = self.transform(batch)
        except Exception as exc:
            self._split(batch, exc, pieces, settle)
            return
        try:
            self._take(result, batch, pieces, settle)
        except OutputSchemaMismatch as exc:
            self._split(batch, exc, pieces, settle)

    def _split(
        self,
        batch: pa.RecordBatch,
        error: Exception,
        pieces: list[pa.RecordBatch],
        settle: _Settler,
    ) -> None:
        if batch.num_rows == 1:
            settle.one(batch.column(0)[0].as_py(), as_failed(error, self.permanent))
            return
        half = batch.num_rows // 2
        self._run(batch.slice(0, half), pieces, settle)
        self._run(batch.slice(half), pieces, settle)

    def _take(
        self, result: Any, batch: pa.RecordBatch, pieces: list[pa.RecordBatch], settle: _Settler
    ) -> None:
        """Keep ``result``'s rows and settle the errors it gives, or raise
        :class:`OutputSchemaMismatch` if it is not what the function must return."""
        rows, errors = _parts(result, batch.num_rows)
        piece = self._fitted(rows)
        if errors is not None:
            seqs = batch.column(0).to_pylist()
            for seq, error in zip(seqs, errors, strict=True):
                if error is not None:
                    settle.one(seq, as_failed(_exception(error), self.permanent))
        if piece.num_rows:
            pieces.append(piece)

    def _fitted(self, rows: Any) -> pa.RecordBatch:
        """``rows`` as one batch of the output schema, or :class:`OutputSchemaMismatch`."""
        table = _table(rows)
        target = self._arrow
        missing = [name for name in target.names if name not in table.column_names]
        if missing:
            raise OutputSchemaMismatch(f"the rows have no column(s) {', '.join(missing)}")
        extra = [name for name in table.column_names if name not in target.names]
        if extra and not self.output.ignore_extra_fields:
            raise OutputSchemaMismatch(
                f"column(s) {', '.join(extra)} are not in the schema"
                " (ignore_extra_fields=True drops them)"
            )
        try:
            fitted = table.select(target.names).cast(target)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise OutputSchemaMismatch(f"the rows do not cast to the schema: {exc}") from None
        for field in target:
            if not field.nullable and fitted.column(field.name).null_count:
                raise OutputSchemaMismatch(f"field {field.name!r}: null for a NOT NULL field")
        return fitted.combine_chunks().to_batches()[0] if fitted.num_rows else _empty(target)

    def _concat(self, pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
        if not pieces:
            return _empty(self._arrow)
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    @cached_property
    def _arrow(self) -> pa.Schema:
        return self.output.arrow


@dataclass
class _Settler:
    """Collects the failures of one chunk."""

    lock_token: str
    failed: list[Failure]

    def one(self, seq: int, result: Failed | Crashed) -> None:
        self.failed.append(settlement(seq, self.lock_token, result))


def _parts(result: Any, count: int) -> tuple[Any, Sequence[Any] | None]:
    """The rows and the per-message errors (None: none given) of what the function
    returned."""
    if isinstance(result, tuple):
        if len(result) != 2:
            raise OutputSchemaMismatch(
                f"map_batches returns rows or (rows, errors), not a tuple of {len(result)}"
            )
        rows, errors = result
        if isinstance(errors, pa.ChunkedArray | pa.Array):
            errors = errors.to_pylist()
        if not isinstance(errors, Sequence) or isinstance(errors, str | bytes):
            raise OutputSchemaMismatch(
                f"the errors map_batches returns are a list, one per message, not"
                f" {type(errors).__name__}"
            )
        if len(errors) != count:
            raise OutputSchemaMismatch(
                f"map_batches returned {len(errors)} error(s) for a batch of {count}"
                " message(s): give one per message, None for a good one"
            )
        return rows, errors
    return result, None


def _table(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if type(rows).__name__ == "DataFrame" and hasattr(rows, "to_records"):  # pandas
        return pa.Table.from_pandas(rows, preserve_index=False)
    raise OutputSchemaMismatch(
        "map_batches returns its rows as a pyarrow RecordBatch or Table or a pandas"
        f" DataFrame, not {type(rows).__name__}"
    )


def _exception(error: Any) -> Exception:
    """A per-message error as an exception: a text is a :class:`Rejected`."""
    if isinstance(error, Exception):
        return error
    if isinstance(error, str):
        return Rejected(error)
    return OutputSchemaMismatch(
        f"an error map_batches returns is an exception, a text or None, not {type(error).__name__}"
    )


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
