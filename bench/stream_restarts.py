"""What one job-failing row costs a plain streaming query through the source, restarted in
the same process: restarts, micro-batches and seconds, beside a clean run of the same query.

The query is the one issue trials run: sensor events whose timestamps are cast (ANSI: a bad
one fails the job) and appended to Parquet, ``trigger(availableNow=True)``, restarted from
its checkpoint by :func:`poisonq.spark.run_restarting` until it ends. Both runs use one
SparkSession and fresh SQLite stores. Prints one line per run, then their ratio:

``run=clean messages=10000 batch=2000 restarts=0 micro_batches=5 seconds=9.1``
``run=one_cast_error ... restarts=5 micro_batches=31 seconds=30.2 dead_lettered=1``
``ratio=3.3 extra_seconds=21.1``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import poisonq
from poisonq.spark import local_session, run_restarting


def run(spark: SparkSession, folder: Path, args: argparse.Namespace, bad: int | None) -> float:
    url = f"sqlite:///{folder / 'queue.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("events", max_delivery_count=args.max_delivery_count)
        stamps = ["2026-11-26 10:00:00"] * args.messages
        if bad is not None:
            stamps[bad] = "26/11/2026 10h"
        bodies = [json.dumps({"n": n, "ts": ts}) for n, ts in enumerate(stamps)]
        broker.sender("events").send([poisonq.Message(body=body) for body in bodies])

        def start():  # type: ignore[no-untyped-def]
            events = (
                spark.readStream.format("poisonq")
                .option("url", url)
                .option("maxMessagesPerBatch", str(args.batch))
                .load("events")
            )
            ts = F.get_json_object(F.col("body").cast("string"), "$.ts").cast("timestamp")
            return (
                events.select("sequence_number", ts.alias("ts"))
                .writeStream.format("parquet")
                .option("path", str(folder / "out"))
                .option("checkpointLocation", str(folder / "ck"))
                .trigger(availableNow=True)
                .start()
            )

        began = time.perf_counter()
        restarts = run_restarting(start)
        seconds = time.perf_counter() - began
        written = spark.read.parquet(str(folder / "out")).count()
        counts = broker.counts("events")
        assert broker.audit().ok
    batches = len([p for p in (folder / "ck" / "commits").iterdir() if p.name.isdigit()])
    name = "clean" if bad is None else "one_cast_error"
    print(
        f"run={name} messages={args.messages} batch={args.batch}"
        f" max_delivery_count={args.max_delivery_count} restarts={restarts}"
        f" micro_batches={batches} seconds={seconds:.1f} written={written}"
        f" dead_lettered={counts['dead_lettered']}",
        flush=True,
    )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--max-delivery-count", type=int, default=3)
    args = parser.parse_args()
    spark = local_session("stream-restarts")
    with tempfile.TemporaryDirectory() as tmp:
        clean = run(spark, Path(tmp) / "clean", args, None)
        bad = run(spark, Path(tmp) / "bad", args, int(args.messages * 0.457))
    print(f"ratio={bad / clean:.2f} extra_seconds={bad - clean:.1f}")
    spark.stop()


if __name__ == "__main__":
    main()
