"""The executor side of ``map_batches=``: a function of an Arrow batch of messages.

Written for people who write ``mapInArrow`` and pandas UDFs: the function takes a
``pyarrow.RecordBatch`` of messages (the columns of :data:`~poisonq.spark.MESSAGE_SCHEMA_DDL`,
up to 10,000 rows) and returns its output rows in the pipeline's ``schema`` (a
``RecordBatch``, a ``Table``, or a pandas ``DataFrame``), any number of rows a message.
A message's failure is told in one of two ways:

- **returned**: ``(rows, errors)``, ``errors`` with one entry per input row, in order (a list
  or an Arrow array): ``None`` for a good message, else an exception (a
  :class:`~poisonq.PermanentError` or a ``permanent=`` type dead-letters, any other is
  retried) or a non-empty text (a rejection: dead-lettered, ``Rejected``, the text its
  reason). An empty text is no reason: it breaks the contract (below), since a pandas habit
  of ``""`` for "no error" would otherwise dead-letter every good message, and a ``str(exc)``
  of an exception with no text would pass for success. This is the cheap way: a vectorized
  check costs nothing per good row.
- **raised**: an exception for the whole batch (``pyarrow.compute`` raising on one bad value)
  is traced to the messages that raise it alone, by calling the function again on halves of
  the batch, in the same worker, no Spark job: a few calls per bad message.

A row is tied to the message it comes from by its ``sequence_number`` column (the batch's,
selected into the rows: the way to return several rows a message, or none). Rows returned
with errors must be tied so, since the rows of a failed message are left out (a retried
message's row would be written again on its retry, a rejected one's written at all); a row's
place would not do: a sort or a join in the function reorders rows, and the rows of good
messages would be dropped for the failed ones', with nothing to show it. Rows returned alone
need not be tied, their failures being raised; when they are fewer than the messages, the
messages without a row are completed as filtered, and a warning (once per batch) says how
many, since a function that drops rows by mistake looks the same (tied rows filter on
purpose, and are not warned about). ``sequence_number`` is written only if the schema has it.

Whatever breaks that contract (errors of another count than the messages, rows that cannot
be tied, another type, an empty text) is the function's defect, not its messages': it raises
:class:`~poisonq.errors.BatchFunctionError`, never traced to a message, and the task fails
with it as a :class:`~poisonq.spark.settling.DefectFound`, so the run stops and the lease is
given back with nothing of that task settled. Output rows must have the schema's columns (extra
ones are an error unless ``ignore_extra_fields``); each column is cast to its type safely (no
overflow, no lost fraction) and a ``NOT NULL`` field must have no null. A batch whose output
does not fit fails like an exception, and a message that does not fit alone is
dead-lettered ``OutputSchemaMismatch``. A crash (a Python worker's death) switches the run to
the crash guard, which calls the function in a child process (:mod:`poisonq.worker.guard`)
on chunks of up to :data:`GUARDED_CHUNK` messages, for the rest of that run; a chunk that
crashes is split, as a batch that raises is halved, down to the message that crashes alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from poisonq.defects import Defect
from poisonq.errors import BatchFunctionError, PermanentError
from poisonq.failures import fingerprint
from poisonq.model import FailureRecord
from poisonq.spark.rows import ERROR_TYPE as SCHEMA_MISMATCH
from poisonq.spark.schema import lease_batch
from poisonq.spark.settling import DefectFound, Failure
from poisonq.spark.source import SEQUENCE
from poisonq.spark.work import FunctionWork, function_name, settlement
from poisonq.worker.guard import Crashed, Failed, run_isolated
from poisonq.worker.guard import failed as as_failed
from poisonq.worker.raised import raised

log = logging.getLogger(__name__)
BatchFunction = Callable[[pa.RecordBatch], Any]


class Rejected(PermanentError):
    """A message the batch function failed with a text instead of an exception."""


class OutputSchemaMismatch(PermanentError):
    """A batch function's rows that do not fit the pipeline's schema."""


# Messages in one call of the function under the crash guard: a call's fixed cost (an Arrow
# batch built, the result pickled back) is spread over that many. A chunk that crashes is
# split in CRASH_PARTS and the part that crashes again likewise, down to the message: a
# crash costs a fork and a child's first pages, far more than a call, so two splits of 16
# (a crash each) beat eight halvings. A chunk that raises is halved, as in the worker.
GUARDED_CHUNK = 256
CRASH_PARTS = 16


@dataclass(frozen=True)
class OnLeaseChunk:
    """The batch function on a chunk of lease rows, as the crash guard runs it: its result
    for the batch of those messages. (``transform``, as :class:`~poisonq.worker.lease_rows.
    OnLeaseRows` names it, so the guard pickles the function's module by value.)

    The result goes back to the caller pickled, so an exception returned as a message's
    error is taken down as data, as a raised one is (:func:`poisonq.worker.raised.raised`):
    its class may be one the caller's pickle cannot name (a job file's, loaded by value),
    and a result that does not pickle would end the child as a crash would."""

    transform: BatchFunction
    permanent: tuple[type[BaseException], ...]

    def __call__(self, rows: list[tuple[Any, ...]]) -> Any:
        result = self.transform(lease_batch(rows))
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], list | tuple):
            out, errors = result
            kinds = self.permanent
            return out, [raised(e, kinds) if isinstance(e, Exception) else e for e in errors]
        return result

    def warm_up(self) -> None:
        """Build a batch of messages, with and without properties, in the guard's helper
        before it forks (:func:`poisonq.worker.child.helper_main`): Arrow's first use in a
        process loads its compute functions and memory pool, which each child after a
        crash would do again."""
        row: tuple[Any, ...] = (0, "", b"", None, None, None, None, None, 0.0, 1)
        lease_batch([row, (*row[:5], '{"warm": 1}', *row[6:])])


@dataclass(frozen=True)
class BatchTransform(FunctionWork):
    """What a ``map_batches`` pipeline runs on each chunk of a lease (picklable)."""

    transform: BatchFunction

    def apply(
        self, rows: list[tuple[Any, ...]], lock_token: str, failed: list[Failure]
    ) -> pa.RecordBatch:
        """The output rows of lease ``rows``; their failures are added to ``failed``. A
        :class:`~poisonq.errors.BatchFunctionError` fails the task as a defect
        (:class:`DefectFound`) before any of its failures is settled."""
        settle = _Settler(lock_token, failed)
        pieces: list[pa.RecordBatch] = []
        try:
            if self.isolate:
                self._run_isolated(rows, pieces, settle)
            else:
                self._run(lease_batch(rows), pieces, settle)
        except BatchFunctionError as exc:
            failure = FailureRecord(time.time(), type(exc).__name__, str(exc))
            raise DefectFound(Defect(failure, len(rows), len(rows))) from exc
        if settle.rowless:
            log.warning(
                "map_batches function %s returned fewer rows than messages, with no errors"
                " and no sequence_number column: %s of this batch's %s message(s) (at least)"
                " had no row and are completed as filtered; return (rows, errors) to fail"
                " a message, or tie the rows by sequence_number to filter on purpose",
                self._name,
                settle.rowless,
                len(rows),
            )
        return self._concat(pieces)

    def _run_isolated(
        self, rows: list[tuple[Any, ...]], pieces: list[pa.RecordBatch], settle: _Settler
    ) -> None:
        """The function under the crash guard, on chunks of :data:`GUARDED_CHUNK` messages."""
        chunks = [rows[at : at + GUARDED_CHUNK] for at in range(0, len(rows), GUARDED_CHUNK)]
        self._run_chunks(chunks, pieces, settle)

    def _run_chunks(
        self,
        chunks: list[list[tuple[Any, ...]]],
        pieces: list[pa.RecordBatch],
        settle: _Settler,
    ) -> None:
        """Each chunk through the function in a child of the crash guard; a chunk that
        crashes, raises or returns rows that do not fit is split (:data:`CRASH_PARTS`) and
        its parts run again, down to the messages that do so alone, as :meth:`_run` halves
        a batch that raises: one crashing message costs a fork per split, not a call per
        message."""
        chunk_of = OnLeaseChunk(self.transform, self.permanent)
        results = run_isolated(chunk_of, chunks, self.permanent, window=1)
        for chunk, result in zip(chunks, results, strict=True):
            failure: Failed | Crashed | OutputSchemaMismatch = result
            if type(result) is not Failed and type(result) is not Crashed:
                try:
                    self._take(result, lease_batch(chunk), pieces, settle)
                    continue
                except OutputSchemaMismatch as exc:
                    failure = exc
            if len(chunk) > 1:
                parts = CRASH_PARTS if type(failure) is Crashed else 2
                step = -(-len(chunk) // parts)
                self._run_chunks(
                    [chunk[at : at + step] for at in range(0, len(chunk), step)], pieces, settle
                )
            elif isinstance(failure, OutputSchemaMismatch):
                settle.one(chunk[0][0], self._failed(failure))
            else:
                settle.one(chunk[0][0], failure)

    def _run(self, batch: pa.RecordBatch, pieces: list[pa.RecordBatch], settle: _Settler) -> None:
        """The function over ``batch``; on an exception, over each half of it, down to the
        messages that raise alone."""
        error: Exception
        try:
            result = self.transform(batch)
        except Exception as exc:
            error = exc
        else:
            try:
                self._take(result, batch, pieces, settle)
                return
            except OutputSchemaMismatch as exc:
                error = exc
        # Split outside the handler: an exception a half raises is its own, not one raised
        # "during handling" of this one (whose root cause would be taken for its reason).
        self._split(batch, error, pieces, settle)

    def _split(
        self,
        batch: pa.RecordBatch,
        error: Exception,
        pieces: list[pa.RecordBatch],
        settle: _Settler,
    ) -> None:
        if batch.num_rows == 1:
            settle.one(batch.column(0)[0].as_py(), self._failed(error))
            return
        half = batch.num_rows // 2
        self._run(batch.slice(0, half), pieces, settle)
        self._run(batch.slice(half), pieces, settle)

    def _failed(self, error: Exception) -> Failed:
        """The failure of a message that raised ``error`` alone. Rows that do not fit the
        schema are told as ``map=`` tells them, by the schema, with no traceback of
        poisonq's own checks (there is no frame of the function in it to show)."""
        if not isinstance(error, OutputSchemaMismatch):
            return as_failed(error, self.permanent)
        told = (
            f"{SCHEMA_MISMATCH}: {error}\nthe output schema is: {self.output.struct.simpleString()}"
        )
        record = FailureRecord(time.time(), SCHEMA_MISMATCH, str(error), told, fingerprint(error))
        return Failed(record, True)

    def _take(
        self, result: Any, batch: pa.RecordBatch, pieces: list[pa.RecordBatch], settle: _Settler
    ) -> None:
        """Keep the rows of ``result`` whose messages did not fail, and settle the errors
        it gives; :class:`OutputSchemaMismatch` (nothing settled) if the rows do not fit
        the schema, :class:`~poisonq.errors.BatchFunctionError` if ``result`` is not what
        the function must return."""
        rows, errors = self._parts(result, batch.num_rows)
        table = self._table(rows)
        failures = {} if errors is None else self._failures(batch, errors)
        owners = self._owners(table, batch, tied=errors is not None)
        if owners is None:  # untied rows: fewer than messages means some had none
            settle.rowless += max(0, batch.num_rows - table.num_rows)
        if failures:
            assert owners is not None  # rows returned with errors are tied to their messages
            dropped = pc.is_in(owners, value_set=pa.array(list(failures), pa.int64()))
            table = table.filter(pc.invert(dropped))
        piece = self._fitted(table)
        for seq, failure in failures.items():
            settle.one(seq, failure)
        if piece.num_rows:
            pieces.append(piece)

    def _parts(self, result: Any, count: int) -> tuple[Any, Sequence[Any] | None]:
        """The rows and the per-message errors (None: none given) of what the function
        returned for a batch of ``count`` messages."""
        if not isinstance(result, tuple):
            return result, None
        if len(result) != 2:
            raise self._defect(f"returned a tuple of {len(result)}: return rows, or (rows, errors)")
        rows, errors = result
        if isinstance(errors, pa.ChunkedArray | pa.Array):
            errors = errors.to_pylist()
        if not isinstance(errors, Sequence) or isinstance(errors, str | bytes):
            raise self._defect(
                f"returned its errors as {type(errors).__name__}: return a list or an Arrow"
                " array, one entry per message"
            )
        if len(errors) != count:
            raise self._defect(
                f"returned {len(errors)} error(s) for a batch of {count} message(s): return"
                " one per message, in the batch's order, None for a good one"
            )
        return rows, errors

    def _failures(self, batch: pa.RecordBatch, errors: Sequence[Any]) -> dict[int, Failed]:
        """The failure of each message given an error (a text is a :class:`Rejected`)."""
        found: dict[int, Failed] = {}
        for row, (seq, error) in enumerate(zip(batch.column(0).to_pylist(), errors, strict=True)):
            if error is None:
                continue
            if isinstance(error, Failed):  # taken down in a child of the guard (OnLeaseChunk)
                found[seq] = error
                continue
            if isinstance(error, str):
                if not error.strip():
                    raise self._defect(
                        f"returned an empty text as the error of message {seq} (row {row} of"
                        " the batch): a text is the reason a message is rejected for; give"
                        " None for a good message"
                    )
                error = Rejected(error)
            elif not isinstance(error, Exception):
                raise self._defect(
                    f"returned an error of type {type(error).__name__}: an error is an"
                    " exception, a text (a rejection) or None"
                )
            found[seq] = as_failed(error, self.permanent)
        return found

    def _owners(self, table: pa.Table, batch: pa.RecordBatch, tied: bool) -> Any:
        """The sequence number of each row's message: its ``sequence_number`` column, which
        must name messages of the batch. Rows returned with errors must be ``tied`` so (the
        rows of a failed message are left out); rows returned alone need not be (None: not
        known)."""
        if SEQUENCE in table.column_names:
            owners = table.column(SEQUENCE)
            if not pa.types.is_integer(owners.type):
                raise self._defect(
                    f"returned a sequence_number column of type {owners.type}: select the"
                    " batch's own (int64) into the rows"
                )
            try:
                known = pc.is_in(owners, value_set=batch.column(0))
                untied = pc.sum(pc.invert(known)).as_py()
            except pa.ArrowException:
                untied = table.num_rows
            if untied:
                raise self._defect(
                    f"returned {untied} row(s) whose sequence_number is no message of the"
                    " batch: give each row the sequence_number of the message it comes from"
                )
            return owners
        if not tied:
            return None
        raise self._defect(
            f"returned {table.num_rows} row(s) and an error per message with no"
            " sequence_number column: give each row the sequence_number of the message it"
            ' comes from (rows.append_column("sequence_number", batch.column("sequence_number"))'
            " for a row per message, in order), so that a failed message's rows are the ones"
            " left out"
        )

    def _table(self, rows: Any) -> pa.Table:
        table = rows_table(rows)
        if table is None:
            raise self._defect(
                f"returned its rows as {type(rows).__name__}: return a pyarrow RecordBatch or"
                " Table or a pandas DataFrame"
            )
        return table

    def _defect(self, problem: str) -> BatchFunctionError:
        return BatchFunctionError(self._name, problem)

    @property
    def _name(self) -> str:
        return function_name(self.transform)

    def _fitted(self, table: pa.Table) -> pa.RecordBatch:
        """``table`` as one batch of the output schema, or :class:`OutputSchemaMismatch`."""
        target = self._arrow
        missing = [name for name in target.names if name not in table.column_names]
        if missing:
            raise OutputSchemaMismatch(f"the rows have no column(s) {', '.join(missing)}")
        extra = [n for n in table.column_names if n not in target.names and n != SEQUENCE]
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
    """Collects the failures of one chunk, and counts its messages left without a row by
    rows not tied to them (``rowless``)."""

    lock_token: str
    failed: list[Failure]
    rowless: int = 0

    def one(self, seq: int, result: Failed | Crashed) -> None:
        self.failed.append(settlement(seq, self.lock_token, result))


def rows_table(rows: Any) -> pa.Table | None:
    """``rows`` as a table, if they are rows a batch function may return (a ``RecordBatch``,
    a ``Table``, a pandas ``DataFrame``); else None."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if type(rows).__name__ == "DataFrame" and hasattr(rows, "to_records"):  # pandas
        return pa.Table.from_pandas(rows, preserve_index=False)
    return None


def try_on_a_batch(function: Callable[..., Any]) -> bool | None:
    """What ``function`` does given an empty batch of messages: ``True`` if it answers as a
    batch function does (rows, or ``(rows, errors)``), which no function of one message
    does; ``False`` if it answers anything else or raises; ``None`` if it killed its
    process. The command line tells the two kinds apart with it before Spark starts, under
    the crash guard, so that a function that kills its process given a batch (a function
    of one message, a native library) ends a child, not the command."""
    [answer] = run_isolated(_AnswersABatch(function), [None], ())
    if type(answer) is Crashed:
        return None
    return answer is True


@dataclass(frozen=True)
class _AnswersABatch:
    """Whether ``transform`` returns rows given an empty batch of messages (picklable, for
    the guard; ``transform`` is the name the guard looks for the user's module under)."""

    transform: Callable[..., Any]

    def __call__(self, _: object) -> Any:  # a bool, where the guard expects a row
        result = self.transform(lease_batch([]))
        rows = result[0] if isinstance(result, tuple) and len(result) == 2 else result
        return rows_table(rows) is not None


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
