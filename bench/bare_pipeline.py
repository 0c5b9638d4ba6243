"""Floors of a pipeline over a SQLite queue: the least a queue can add to a plain Spark job,
with none of poisonq's code in the way, for two ways of keeping messages.

- ``rows``, today's design: one row a message (poisonq's own ``messages`` table, filled by
  poisonq). A Python data source reads each batch's rows with bare SQL (the columns a lease
  has, by sequence range, as poisonq's lease covers do), builds the Arrow batch a function of
  messages takes, runs the function and yields its rows; the failed messages are marked
  dead-lettered in one statement per partition; the driver takes each batch as one row's
  write and, once its output is written, deletes its rows while the next batch's job runs.
- ``segments``, the design that would remove the per-message cost: the messages of a send of
  10,000 kept as one row holding them as an Arrow IPC stream, per-message rows written only
  for the messages whose state leaves their segment's (here, the failed ones). A batch reads
  its segments, runs the function on each, and completing it deletes a row a segment.

No failure history, no defect check, no audit, no crash guard. :func:`bare_run` is called by
``bench/pipeline_throughput.py`` on a copy of a queue poisonq filled, in the same Spark session
as the pipeline it measures.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " enqueued_at, delivery_count"
)
NAMES = (
    "sequence_number", "message_id", "body", "content_type", "subject", "properties",
    "session_id", "correlation_id", "enqueued_time", "delivery_count",
)  # fmt: skip
TYPES = (
    pa.int64(), pa.string(), pa.binary(), pa.string(), pa.string(), pa.string(),
    pa.string(), pa.string(), pa.float64(), pa.int32(),
)  # fmt: skip
ROWS = 10_000  # a batch the function is given, as the pipeline's; a segment's messages
PER_PARTITION = 50_000
Function = Callable[[pa.RecordBatch], Any]
# Per layout: the batch's messages (parameters lo, hi) and its completion.
READ = {
    "rows": f"SELECT {COLUMNS} FROM messages WHERE seq BETWEEN ? AND ? AND state = 'active'",
    "segments": "SELECT stream FROM segments WHERE lo BETWEEN ? AND ? ORDER BY lo",
}
COMPLETE = {
    "rows": "DELETE FROM messages WHERE seq BETWEEN ? AND ? AND state = 'active'",
    "segments": "DELETE FROM segments WHERE lo BETWEEN ? AND ?",
}


@dataclass
class Span(InputPartition):
    lo: int
    hi: int


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(c, t) for c, t in zip(columns, TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=list(NAMES))


def _batches(db: sqlite3.Connection, layout: str, span: Span) -> Iterator[pa.RecordBatch]:
    found = db.execute(READ[layout], (span.lo, span.hi)).fetchall()
    if layout == "rows":
        for start in range(0, len(found), ROWS):
            yield _batch(found[start : start + ROWS])
    else:
        for (stream,) in found:
            yield pa.ipc.open_stream(stream).read_next_batch()


def bare_source(layout: str, function: Function, struct: str) -> type[DataSource]:
    """A data source (options ``path``, ``lo``, ``hi``, ``parts``) that runs ``function`` (a
    ``map_batches=`` function: rows tied by ``sequence_number``, an error per message) over
    the messages in ``[lo, hi]`` kept as ``layout`` and yields its rows."""

    class BareReader(DataSourceReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.path = options["path"]
            self.lo, self.hi, self.parts = (int(options[k]) for k in ("lo", "hi", "parts"))

        def partitions(self) -> list[Span]:
            lo, hi = self.lo, self.hi
            width = -(-(hi - lo + 1) // self.parts)
            return [Span(a, min(hi, a + width - 1)) for a in range(lo, hi + 1, width)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            assert isinstance(partition, Span)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=60)
            failed: list[int] = []
            for batch in _batches(db, layout, partition):
                out, errors = function(batch)
                seqs = batch.column(0).to_pylist()
                failed += [s for s, e in zip(seqs, errors, strict=True) if e is not None]
                yield out.drop_columns(["sequence_number"])
            if layout == "rows":
                db.execute(
                    "UPDATE messages SET state = 'dead_lettered' WHERE seq IN"
                    " (SELECT value FROM json_each(?))",
                    (str(failed),),
                )
            else:
                db.execute("INSERT INTO apart SELECT value FROM json_each(?)", (str(failed),))
            db.close()

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return f"poisonq_bare_{layout}"

        def schema(self) -> str:
            return struct

        def reader(self, schema: Any) -> DataSourceReader:
            return BareReader(self.options)

    return BareSource


def make_segments(path: str, lo: int, hi: int) -> None:
    """Keep the messages ``[lo, hi]`` of ``path``'s ``messages`` as segments of :data:`ROWS`
    (what a send of that many would write), beside a table of the messages set apart."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE segments (lo INTEGER PRIMARY KEY, hi INTEGER, stream BLOB)")
    db.execute("CREATE TABLE apart (seq INTEGER PRIMARY KEY)")
    db.execute("BEGIN")
    for first in range(lo, hi + 1, ROWS):
        last = min(hi, first + ROWS - 1)
        rows = db.execute(READ["rows"], (first, last)).fetchall()
        batch = _batch(rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        db.execute("INSERT INTO segments VALUES (?, ?, ?)", (first, last, sink.getvalue()))
    db.execute("COMMIT")
    db.close()


def bare_run(
    spark: SparkSession,
    layout: str,
    path: str,
    span: tuple[int, int],
    batch: int,
    function: Function,
    struct: str,
    output: str,
) -> float:
    """Seconds to run ``function`` over the messages ``span`` of the SQLite queue at ``path``
    kept as ``layout``, in batches of ``batch``, each batch's output into Parquet, then the
    batch completed (beside the next batch's job)."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # bench/: not on workers' path
    spark.dataSource.register(bare_source(layout, function, struct))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    db.execute("CREATE TABLE IF NOT EXISTS bare_leases (lo INTEGER, hi INTEGER)")
    cores = spark.sparkContext.defaultParallelism
    store = ThreadPoolExecutor(1)
    completing: Future[Any] | None = None
    started = time.perf_counter()
    for lo in range(span[0], span[1] + 1, batch):
        hi = min(span[1], lo + batch - 1)
        db.execute("INSERT INTO bare_leases VALUES (?, ?)", (lo, hi))  # the lease: a row
        parts = max(cores, -(-(hi - lo + 1) // PER_PARTITION))
        frame = (
            spark.read.format(f"poisonq_bare_{layout}")
            .options(path=path, lo=lo, hi=hi, parts=parts)
            .load()
        )
        frame.write.mode("overwrite").parquet(f"{output}/{layout}/lease={lo}")
        if completing is not None:
            completing.result()
        completing = store.submit(db.execute, COMPLETE[layout], (lo, hi))
    if completing is not None:
        completing.result()
    seconds = time.perf_counter() - started
    store.shutdown()
    db.close()
    return seconds
