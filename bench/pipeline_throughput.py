"""Pipeline throughput against a plain Spark job over the same data, for both kinds of transform.

The per-row ``map``: enqueues ``--messages`` JSON orders (``--poison`` of them raise a
permanent error), then measures, after a warm-up:

- the pipeline: ``poisonq.spark.Pipeline(map=…)`` from the queue into Parquet, every message
  settled;
- the plain job: the same function with ``mapInArrow`` over the same bodies stored in Parquet
  (written by Spark, one file per core, as a user's data is), into Parquet (bad rows skipped),
  timed warm (its second run in the session): what the work costs without a queue and
  without isolation;
- the pipeline over as many orders with ``--crash`` of them (on top) killing the Python
  process that transforms them, on each of their 3 deliveries, beside the same pipeline over
  as many orders without crashers: the wall time the crashes add, per crash, is
  ``ms_per_crash``. The two run next to each other, taking turns to go first, in
  ``--crash-rounds`` rounds on fresh queues, and the median is printed (a single pair
  moved from 0.2 to 9 ms with the machine's load).

The DataFrame ``transform``: as many orders again on a second queue (``--poison`` of them bad:
half malformed JSON, half a negative amount), and:

- the pipeline: ``Pipeline(transform=…, expectations=…)``, Spark SQL (``from_json``) whose rows
  failing an expectation dead-letter their message;
- the plain job: the same Spark SQL over the same bodies in Parquet, the expectations as a
  ``WHERE`` that drops the bad rows, into Parquet (the same files, timed warm as above).

``bench/sensor_events.py`` times a DataFrame pipeline shaped as a user writes it (a timestamp
cast, a division) against the same plain SQL, at several batch sizes.

The columnar ``map_batches``: the same parse as a function of an Arrow batch that returns an
error per message, over as many orders again, against the same plain ``mapInArrow`` job, and
beside them two floors of a queue under that job (``bench/bare_pipeline.py``: the same
function over the messages read with bare SQL, completed once written): ``bare_rows_ratio``
keeps a row a message, as poisonq does, and is what no pipeline over such a store can beat;
``bare_segments_ratio`` keeps each send of 10,000 as one Arrow row.

Each pipeline is timed warm, as the plain jobs are: a run of one full batch on a queue of its
own comes first (the first large batch of a session costs seconds more, the JVM compiling).

Prints five lines: ``pipeline_msgs_per_s=… plain_spark_rows_per_s=… ratio=…
isolation_jobs=… batch_fixed_cost_s=…`` (``map``; the fixed cost is the wall time of a batch
of one message), ``map_batches_msgs_per_s=… batches_ratio=… bare_rows_ratio=…
bare_segments_ratio=…``,
``crashing_pipeline_msgs_per_s=… crashes=… ms_per_crash=… ms_per_crash_rounds=…
isolation_jobs=… batches=… clean_batches=…`` (medians over the rounds; the batches of a
crashing run include any that retried its crashed messages),
``dataframe_pipeline_msgs_per_s=… plain_spark_sql_rows_per_s=… dataframe_ratio=…`` and the
peak memory over the whole run: ``driver_python_peak_rss_mb=… driver_jvm_peak_rss_mb=…
process_tree_peak_rss_mb=…`` (the driver's Python process, its JVM, and every process under
the driver together: Python workers, the crash guard's processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from bare_pipeline import bare_run, make_segments
from process_memory import PeakMemory
from pyspark.sql import DataFrame, SparkSession

import poisonq
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.session import local_session

SCHEMA = "order_id long, customer string, amount double"
SEND_BATCH = 10_000
DELIVERIES = 3  # max_delivery_count of the bench's queues
# The DataFrame transform's rules, as expectations in the pipeline and a WHERE in the plain job.
EXPECTATIONS = {"parsed": "order_id IS NOT NULL", "positive": "amount > 0"}


def order(n: int, poison_every: int, crash_every: int = 0) -> bytes:
    """An order for ``map``: every ``poison_every``-th raises a permanent error, and every
    ``crash_every``-th (another one) kills the process transforming it."""
    kind = "ok"
    if poison_every and n % poison_every == 0:
        kind = "invalid"
    elif crash_every and n % crash_every == 1:
        kind = "crash"
    return json.dumps(
        {"order_id": n, "customer": f"C{n % 5000:05d}", "amount": (n % 997) / 10, "kind": kind}
    ).encode()


def sql_order(n: int, poison_every: int) -> bytes:
    """An order for the DataFrame transform: the bad ones are malformed JSON or a negative
    amount, which only the expectations catch."""
    body = {"order_id": n, "customer": f"C{n % 5000:05d}", "amount": (n % 997) / 10 + 0.1}
    if poison_every and n % poison_every == 0:
        if (n // poison_every) % 2:
            return json.dumps(body).encode()[:20]
        body["amount"] = -body["amount"]
    return json.dumps(body).encode()


def order_rows(frame: DataFrame) -> DataFrame:
    """The Spark SQL of the DataFrame transform, over the lease or over the Parquet copy
    (both have ``sequence_number`` and ``body``)."""
    return frame.selectExpr(
        "sequence_number", f"from_json(CAST(body AS STRING), '{SCHEMA}') AS o"
    ).select("sequence_number", "o.*")


def transform(message: dict[str, Any]) -> dict[str, Any]:
    """Parse and validate an order; an unknown customer is permanent, a crash is a crash."""
    data = json.loads(message["body"])
    if data["kind"] == "invalid":
        raise poisonq.PermanentError(f"order {data['order_id']}: unknown customer")
    if data["kind"] == "crash":
        os._exit(1)
    return {"order_id": data["order_id"], "customer": data["customer"], "amount": data["amount"]}


OUT = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())])
TIED = pa.schema([("sequence_number", pa.int64()), *OUT])


def batch_transform(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[Exception | None]]:
    """The same parse as ``map``: an error per message, none for a good one; each row keeps
    the ``sequence_number`` of its message, which ties it to the message (a failed message
    has no row)."""
    rows, errors = [], []
    seqs = batch.column("sequence_number").to_pylist()
    for seq, body in zip(seqs, batch.column("body").to_pylist(), strict=True):
        data = json.loads(body)
        if data["kind"] == "invalid":
            errors.append(poisonq.PermanentError(f"order {data['order_id']}: unknown customer"))
            continue
        if data["kind"] == "crash":
            os._exit(1)
        errors.append(None)
        rows.append(
            {
                "sequence_number": seq,
                "order_id": data["order_id"],
                "customer": data["customer"],
                "amount": data["amount"],
            }
        )
    return pa.RecordBatch.from_pylist(rows, schema=TIED), errors


def plain_transform(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The same parse over Parquet rows, without a queue: bad rows are skipped."""
    out = OUT
    for batch in batches:
        rows = []
        for body in batch.column("body").to_pylist():
            data = json.loads(body)
            if data["kind"] == "ok":
                rows.append(
                    {
                        "order_id": data["order_id"],
                        "customer": data["customer"],
                        "amount": data["amount"],
                    }
                )
        yield pa.RecordBatch.from_pylist(rows, schema=out)


def enqueue(
    broker: poisonq.Broker,
    queue: str,
    make: Callable[[int, int], bytes],
    count: int,
    poison_every: int,
    parquet: Path,
) -> tuple[int, int]:
    """Send ``count`` orders to ``queue`` and write the same bodies to ``parquet``, with
    the sequence numbers the queue gives them; returns the first and last of those."""
    schema = pa.schema([("sequence_number", pa.int64()), ("body", pa.binary())])
    writer = pq.ParquetWriter(parquet, schema)
    sender = broker.sender(queue)
    first = last = 0
    for start in range(0, count, SEND_BATCH):
        bodies = [make(n, poison_every) for n in range(start, min(count, start + SEND_BATCH))]
        seqs = sender.send(
            [poisonq.Message(body=b, message_id=str(start + i)) for i, b in enumerate(bodies)]
        )
        columns = {"sequence_number": pa.array(seqs, pa.int64()), "body": pa.array(bodies)}
        writer.write_table(pa.table(columns, schema=schema))
        first, last = first or seqs[0], seqs[-1]
    writer.close()
    return first, last


def user_copy(spark: SparkSession, parquet: Path) -> Path:
    """The bodies as a user's data would be: written by Spark, one file per core (the
    single file pyarrow writes is read by one task, on one core)."""
    copy = parquet.with_suffix(".spark")
    if not copy.exists():
        frame = spark.read.parquet(str(parquet))
        frame.repartition(spark.sparkContext.defaultParallelism).write.parquet(str(copy))
    return copy


def warm_seconds(job: Callable[[], None]) -> float:
    """The wall time of ``job`` run a second time in the session, as a user running jobs in a
    live session sees it (the first run pays for reading the files' footers and compiling
    the plan)."""
    job()
    started = time.perf_counter()
    job()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--poison", type=float, default=0.01, help="share of bad messages")
    parser.add_argument(
        "--crash", type=float, default=0.001, help="share of crashing messages, on top"
    )
    parser.add_argument(
        "--crash-rounds",
        type=int,
        default=3,
        help="pairs of a clean and a crashing pipeline that ms_per_crash is the median of",
    )
    args = parser.parse_args()
    poison_every = round(1 / args.poison) if args.poison else 0
    crash_every = round(1 / args.crash) if args.crash else 0

    work = Path(tempfile.mkdtemp(prefix="poisonq-bench-"))
    try:
        with PeakMemory() as memory:
            spark = local_session("poisonq-bench")
            url = f"sqlite:///{work / 'queues.db'}"
            with poisonq.connect(url) as broker:
                for queue in ("orders", "batches", "frames"):
                    broker.create_queue(queue, max_delivery_count=DELIVERIES, lock_duration=120)
                for queue in ("tiny", "tiny-frames", "warm", "warm-batches", "warm-frames"):
                    broker.create_queue(queue, lock_duration=120)
                enqueue(
                    broker, "orders", order, args.messages, poison_every, work / "orders.parquet"
                )
                enqueue(broker, "batches", order, args.messages, poison_every, work / "b.parquet")
                frames = work / "frames.parquet"
                enqueue(broker, "frames", sql_order, args.messages, poison_every, frames)
                with poisonq.connect(f"sqlite:///{work / 'bare.db'}") as apart:  # no audit
                    apart.create_queue("bare")
                    bare = enqueue(apart, "bare", order, args.messages, poison_every, work / "d.pq")
                warm = min(args.batch, args.messages)
                for queue, make in (("warm", order), ("warm-batches", order)):
                    enqueue(broker, queue, make, warm, poison_every, work / f"{queue}.parquet")
                enqueue(broker, "warm-frames", sql_order, warm, poison_every, work / "wf.parquet")

                def pipeline(queue: str, output: str, **kind: Any) -> Pipeline:
                    return Pipeline(
                        spark,
                        url=url,
                        queue=queue,
                        output=str(work / output),
                        batch_size=args.batch,
                        **kind,
                    )

                per_row = {"map": transform, "schema": SCHEMA}
                per_batch = {"map_batches": batch_transform, "schema": SCHEMA}
                frames_kind = {"transform": order_rows, "expectations": EXPECTATIONS}

                # Warm-up (JVM, Python workers), then the fixed cost of a one-message batch.
                fixed = []
                for n in range(4):
                    broker.sender("tiny").send(poisonq.Message(body=order(n + 1, 0)))
                    broker.sender("tiny-frames").send(poisonq.Message(body=sql_order(n + 1, 0)))
                    pipeline("tiny-frames", "tiny-frames", **frames_kind).run()
                    started = time.perf_counter()
                    pipeline("tiny", "tiny", **per_row).run()
                    fixed.append(time.perf_counter() - started)
                pipeline("warm", "warm", **per_row).run()
                pipeline("warm-batches", "warm-batches", **per_batch).run()
                pipeline("warm-frames", "warm-frames", **frames_kind).run()

                def plain_job() -> None:
                    plain = spark.read.parquet(str(user_copy(spark, work / "orders.parquet")))
                    plain.mapInArrow(plain_transform, SCHEMA).write.mode("overwrite").parquet(
                        str(work / "plain")
                    )

                plain_seconds = warm_seconds(plain_job)

                started = time.perf_counter()
                report = pipeline("orders", "out", **per_row).run()
                pipeline_seconds = time.perf_counter() - started

                started = time.perf_counter()
                batches_report = pipeline("batches", "out-batches", **per_batch).run()
                batches_seconds = time.perf_counter() - started

                path = str(work / "bare.db")
                make_segments(path, *bare)
                floors = {
                    layout: bare_run(
                        spark, layout, path, bare, args.batch, batch_transform, SCHEMA, str(work)
                    )
                    for layout in ("rows", "segments")
                }

                crash_rounds = []
                for round_ in range(args.crash_rounds):
                    sides = {"clean": order, "crashing": partial(order, crash_every=crash_every)}
                    for side, make in sides.items():
                        queue = f"{side}-{round_}"
                        broker.create_queue(queue, max_delivery_count=DELIVERIES, lock_duration=120)
                        enqueue(broker, queue, make, args.messages, poison_every, work / "c.pq")
                    seconds, reports = {}, {}
                    for side in sorted(sides, reverse=bool(round_ % 2)):  # in turns
                        started = time.perf_counter()
                        reports[side] = pipeline(f"{side}-{round_}", f"out-{side}", **per_row).run()
                        seconds[side] = time.perf_counter() - started
                    crashed = broker.count_dead_letters(
                        f"crashing-{round_}", reason="MaxDeliveryCountExceeded"
                    )
                    crash_rounds.append((seconds, reports, crashed))

                def plain_sql_job() -> None:
                    rules = " AND ".join(f"({sql})" for sql in EXPECTATIONS.values())
                    bodies = spark.read.parquet(str(user_copy(spark, frames)))
                    plain_sql = order_rows(bodies).where(rules)
                    plain_sql.write.mode("overwrite").parquet(str(work / "plain-frames"))

                plain_sql_seconds = warm_seconds(plain_sql_job)

                started = time.perf_counter()
                frame_report = pipeline("frames", "out-frames", **frames_kind).run()
                frame_seconds = time.perf_counter() - started

                assert broker.audit().ok
                counts = broker.counts("orders")
                frame_counts = broker.counts("frames")
                crashing_counts = [broker.counts(f"crashing-{n}") for n in range(args.crash_rounds)]
                for held in (counts, frame_counts, *crashing_counts):
                    assert held["active"] == held["locked"] == 0, held

        pipeline_rate = args.messages / pipeline_seconds
        plain_rate = args.messages / plain_seconds
        print(
            f"pipeline_msgs_per_s={pipeline_rate:.0f} plain_spark_rows_per_s={plain_rate:.0f}"
            f" ratio={pipeline_rate / plain_rate:.2f} isolation_jobs={report.isolation_jobs}"
            f" batch_fixed_cost_s={statistics.median(fixed[1:]):.2f}"
            f" batches={report.batches} completed={counts['completed']}"
            f" dead_lettered={counts['dead_lettered']}"
        )
        batches_rate = args.messages / batches_seconds
        print(
            f"map_batches_msgs_per_s={batches_rate:.0f} plain_spark_rows_per_s={plain_rate:.0f}"
            f" batches_ratio={batches_rate / plain_rate:.2f}"
            f" bare_rows_ratio={plain_seconds / floors['rows']:.2f}"
            f" bare_segments_ratio={plain_seconds / floors['segments']:.2f}"
            f" completed={batches_report.completed}"
            f" dead_lettered={sum(batches_report.dead_lettered.values())}"
        )
        # Each crashing message crashes once per delivery (3) before it is dead-lettered.
        crashes = crash_rounds[0][2] * DELIVERIES
        per_crash = [
            (seconds["crashing"] - seconds["clean"]) / (crashed * DELIVERIES) * 1e3
            for seconds, _, crashed in crash_rounds
            if crashed
        ]
        crashing = [seconds["crashing"] for seconds, _, _ in crash_rounds]
        last = crash_rounds[-1][1]
        print(
            f"crashing_pipeline_msgs_per_s={args.messages / statistics.median(crashing):.0f}"
            f" crashes={crashes}"
            f" ms_per_crash={statistics.median(per_crash) if per_crash else 0:.2f}"
            f" ms_per_crash_rounds={','.join(f'{ms:.2f}' for ms in per_crash)}"
            f" isolation_jobs={last['crashing'].isolation_jobs}"
            f" batches={last['crashing'].batches} clean_batches={last['clean'].batches}"
        )
        frame_rate = args.messages / frame_seconds
        plain_sql_rate = args.messages / plain_sql_seconds
        print(
            f"dataframe_pipeline_msgs_per_s={frame_rate:.0f}"
            f" plain_spark_sql_rows_per_s={plain_sql_rate:.0f}"
            f" dataframe_ratio={frame_rate / plain_sql_rate:.2f}"
            f" batches={frame_report.batches} completed={frame_counts['completed']}"
            f" dead_lettered={frame_counts['dead_lettered']}"
        )
        print(memory.line())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
