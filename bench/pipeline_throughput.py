"""Pipeline throughput against a plain Spark job over the same data.

Enqueues ``--messages`` JSON orders (``--poison`` of them bad: half raise a permanent error,
half crash the Python process that transforms them), then measures, after one warm-up job:

- the pipeline: ``poisonq.spark.Pipeline`` from the queue into Parquet, every message settled;
- the plain job: the same transform with ``mapInArrow`` over the same bodies stored in Parquet,
  into Parquet. A crash would kill a plain job, so there the crashing rows are only skipped:
  it is what the work costs without a queue and without isolation.

Prints one line: ``pipeline_msgs_per_s=… plain_spark_rows_per_s=… ratio=… isolation_jobs=…
batch_fixed_cost_s=…``, where the fixed cost is the wall time of a batch of one message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import poisonq
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.session import local_session

SCHEMA = "order_id long, customer string, amount double"
SEND_BATCH = 10_000


def order(n: int, poison_every: int) -> bytes:
    kind = "ok"
    if poison_every and n % poison_every == 0:
        kind = "invalid" if (n // poison_every) % 2 else "crash"
    return json.dumps(
        {"order_id": n, "customer": f"C{n % 5000:05d}", "amount": (n % 997) / 10, "kind": kind}
    ).encode()


def transform(message: dict[str, Any]) -> dict[str, Any]:
    """Parse and validate an order; an unknown customer is permanent, a crash is a crash."""
    data = json.loads(message["body"])
    if data["kind"] == "invalid":
        raise poisonq.PermanentError(f"order {data['order_id']}: unknown customer")
    if data["kind"] == "crash":
        os._exit(1)
    return {"order_id": data["order_id"], "customer": data["customer"], "amount": data["amount"]}


def plain_transform(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The same parse over Parquet rows, without a queue: bad rows are skipped."""
    out = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())])
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


def enqueue(broker: poisonq.Broker, count: int, poison_every: int, parquet: Path) -> None:
    writer = pq.ParquetWriter(parquet, pa.schema([("body", pa.binary())]))
    sender = broker.sender("orders")
    for start in range(0, count, SEND_BATCH):
        bodies = [order(n, poison_every) for n in range(start, min(count, start + SEND_BATCH))]
        sender.send(
            [poisonq.Message(body=b, message_id=str(start + i)) for i, b in enumerate(bodies)]
        )
        writer.write_table(pa.table({"body": pa.array(bodies, pa.binary())}))
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--poison", type=float, default=0.01, help="share of bad messages")
    args = parser.parse_args()
    poison_every = round(1 / args.poison) if args.poison else 0

    work = Path(tempfile.mkdtemp(prefix="poisonq-bench-"))
    try:
        spark = local_session("poisonq-bench")
        url = f"sqlite:///{work / 'queues.db'}"
        with poisonq.connect(url) as broker:
            broker.create_queue("orders", max_delivery_count=3, lock_duration=120)
            broker.create_queue("tiny", lock_duration=120)
            enqueue(broker, args.messages, poison_every, work / "orders.parquet")

            def pipeline(queue: str, output: str) -> Pipeline:
                return Pipeline(
                    spark,
                    url=url,
                    queue=queue,
                    map=transform,
                    schema=SCHEMA,
                    output=str(work / output),
                    batch_size=args.batch,
                )

            # Warm-up (JVM, Python workers), then the fixed cost of a one-message batch.
            fixed = []
            for n in range(4):
                broker.sender("tiny").send(poisonq.Message(body=order(n + 1, 0)))
                started = time.perf_counter()
                pipeline("tiny", "tiny").run()
                fixed.append(time.perf_counter() - started)

            started = time.perf_counter()
            plain = spark.read.parquet(str(work / "orders.parquet"))
            plain.mapInArrow(plain_transform, SCHEMA).write.mode("overwrite").parquet(
                str(work / "plain")
            )
            plain_seconds = time.perf_counter() - started

            started = time.perf_counter()
            report = pipeline("orders", "out").run()
            pipeline_seconds = time.perf_counter() - started
            assert broker.audit().ok
            counts = broker.counts("orders")
            assert counts["active"] == counts["locked"] == 0, counts

        pipeline_rate = args.messages / pipeline_seconds
        plain_rate = args.messages / plain_seconds
        print(
            f"pipeline_msgs_per_s={pipeline_rate:.0f} plain_spark_rows_per_s={plain_rate:.0f}"
            f" ratio={pipeline_rate / plain_rate:.2f} isolation_jobs={report.isolation_jobs}"
            f" batch_fixed_cost_s={statistics.median(fixed[1:]):.2f}"
            f" batches={report.batches} completed={counts['completed']}"
            f" dead_lettered={counts['dead_lettered']}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
