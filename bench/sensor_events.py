"""A DataFrame pipeline shaped as a user writes it, against the plain Spark SQL a user would
compare it with.

``--events`` sensor events as JSON bodies (a sensor, a timestamp as text, a total and a count).
The transform: ``from_json``, the timestamp cast (ANSI on), a division, and one expectation
(the average is not negative). The same bodies go to a SQLite queue and, written by Spark as a
user's data would be (one file per core, so each core reads its part), to Parquet.

- ``plain``: the same SQL over the Parquet bodies, the expectation as a ``WHERE``, into
  Parquet; run twice in the session and timed both times (``plain_cold_s``, ``plain_warm_s``:
  the warm run is what a user who runs jobs in a live session compares with).
- ``pipeline``: ``poisonq.spark.Pipeline(transform=…, expectations=…)`` from the queue into
  Parquet, for each ``--batch`` size given, in that order (``default``: the pipeline's own
  sizes, which grow from 100,000 to 1,000,000 while a backlog waits; a size may come again,
  to take turns on a loaded machine), each on a queue of its own filled before the clock
  starts, after a warm-up run of one batch of up to :data:`WARM_UP` events on a queue of its
  own: warm as the plain job is (a pipeline that runs on is warm after its first batch; the
  first large batch of a session costs seconds more, the JVM compiling its hot code).

Prints ``plain_cold_s=… plain_warm_s=… rows_per_s=…`` and then, per batch size,
``batch=… pipeline_s=… msgs_per_s=… ratio_warm=… ratio_cold=… batches=… jobs_s=… load=…``:
the ratios are the pipeline's rate over the plain job's (the target is ≥ 0.6 of the warm
plain job at 1,000,000), ``jobs_s`` the time of the batches' Spark jobs (the rest is the
store's work that no job overlapped: the first lease, the last completion), ``load`` the
machine's one-minute load average as the pipeline ended (the bench shares it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import poisonq
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.session import local_session

SEND_BATCH = 20_000
WARM_UP = 100_000
EVENT = "sensor string, at string, total double, count long"
EXPECTATIONS = {"average_not_negative": "average >= 0"}


def event(n: int) -> bytes:
    minute = n % 1440
    body = {
        "sensor": f"s{n % 211}",
        "at": f"2026-11-26 {minute // 60:02d}:{minute % 60:02d}:00",
        "total": (n % 997) / 10,
        "count": n % 13 + 1,
    }
    return json.dumps(body).encode()


def readings(batch: DataFrame) -> DataFrame:
    """The user's transform: parse, cast the timestamp, average."""
    parsed = batch.select(
        "sequence_number", F.from_json(F.col("body").cast("string"), EVENT).alias("e")
    )
    return parsed.select(
        "sequence_number",
        "e.sensor",
        F.col("e.at").cast("timestamp").alias("at"),
        (F.col("e.total") / F.col("e.count")).alias("average"),
    )


def fill(broker: poisonq.Broker, queue: str, count: int) -> None:
    broker.create_queue(queue, lock_duration=300)
    sender = broker.sender(queue)
    for start in range(0, count, SEND_BATCH):
        sender.send(
            [poisonq.Message(body=event(n)) for n in range(start, min(count, start + SEND_BATCH))]
        )


def bodies(spark: SparkSession, count: int, path: Path) -> None:
    """The same bodies in Parquet, written by Spark: one file per core."""
    table = pa.table(
        {
            "sequence_number": pa.array(range(1, count + 1), pa.int64()),
            "body": pa.array([event(n) for n in range(count)], pa.binary()),
        }
    )
    frame = spark.createDataFrame(table)
    frame.repartition(spark.sparkContext.defaultParallelism).write.mode("overwrite").parquet(
        str(path)
    )


def plain(spark: SparkSession, source: Path, output: Path) -> float:
    started = time.perf_counter()
    rules = " AND ".join(f"({sql})" for sql in EXPECTATIONS.values())
    readings(spark.read.parquet(str(source))).where(rules).write.mode("overwrite").parquet(
        str(output)
    )
    return time.perf_counter() - started


def batch_size(text: str) -> int | None:
    return None if text == "default" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--batch",
        type=batch_size,
        action="append",
        help="a batch size or 'default' (the pipeline's own); repeatable; default: default",
    )
    args = parser.parse_args()
    sizes: list[int | None] = args.batch or [None]
    runs = [(f"events-{n}", size) for n, size in enumerate(sizes)]  # a size may come again
    work = Path(tempfile.mkdtemp(prefix="poisonq-sensors-"))
    try:
        spark = local_session("poisonq-sensor-bench")
        url = f"sqlite:///{work / 'queues.db'}"
        with poisonq.connect(url) as broker:
            for queue, _ in runs:
                fill(broker, queue, args.events)
            fill(broker, "warm-up", min(WARM_UP, args.events))
        bodies(spark, args.events, work / "bodies")
        cold = plain(spark, work / "bodies", work / "plain")
        warm = plain(spark, work / "bodies", work / "plain")
        print(
            f"plain_cold_s={cold:.2f} plain_warm_s={warm:.2f} rows_per_s={args.events / warm:.0f}"
        )

        def pipeline(queue: str, size: int | None) -> Pipeline:
            return Pipeline(
                spark, url=url, queue=queue, transform=readings, expectations=EXPECTATIONS,
                output=str(work / queue), batch_size=size,
            )  # fmt: skip

        pipeline("warm-up", WARM_UP).run()
        for queue, size in runs:
            started = time.perf_counter()
            report = pipeline(queue, size).run()
            seconds = time.perf_counter() - started
            assert report.completed == args.events, report
            with poisonq.connect(url) as broker:
                timeline = broker.pipeline_batches("pipeline", queue)
            print(
                f"batch={size or 'default'} pipeline_s={seconds:.2f}"
                f" msgs_per_s={args.events / seconds:.0f}"
                f" ratio_warm={warm / seconds:.2f} ratio_cold={cold / seconds:.2f}"
                f" batches={report.batches} jobs_s={sum(b.seconds for b in timeline):.2f}"
                f" load={os.getloadavg()[0]:.1f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
