"""What a row that fails the whole Spark job costs the pipeline runner, beside a clean run.

A ``transform=`` pipeline over sensor events (JSON bodies parsed with ``from_json``, the
timestamp cast with ANSI on) from a SQLite queue into Parquet, in batches of ``--batch``
messages. Each scenario runs on a queue of its own, filled before the clock starts, with the
same number of messages as the clean run it is compared with, in the same process:

- ``clean``: no bad row;
- ``cast``: one malformed timestamp (``CAST_INVALID_INPUT``, a data error: dead-lettered on
  its first isolation);
- ``crash``: one event whose plain Python UDF kills its worker (``os._exit``), on each of
  its deliveries (the queue's ``max_delivery_count`` is 3);
- ``five_casts``: five malformed timestamps in twice ``--batch`` messages, against a clean run
  of as many.

- ``demo`` (only when asked with ``--scenario demo``): ``poisonq demo`` (200,000 orders, two
  of them job-failing) against ``poisonq demo --without-job-failing``, each in a process of
  its own, wall time (the target is a ratio of at most 1.35).

Prints one line per scenario, ``scenario=cast messages=100000 batch=100000 wall_s=… clean_s=…
extra_s=… extra_per_clean_batch=… ratio=… isolation_jobs=… dead_lettered=…``: ``extra_s`` is
the wall time over the clean run, ``extra_per_clean_batch`` that time over one clean batch's
(the target is at most 1 for one bad row), ``ratio`` the wall time over the clean run's (the
target for five casts is at most 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

import poisonq
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.session import local_session

SEND_BATCH = 10_000
DELIVERIES = 3
EVENT = "sensor string, reading double, at string, crash boolean"


def event(n: int, bad: frozenset[int], crash: frozenset[int]) -> bytes:
    at = "2026-11-26 12:00:00" if n not in bad else "26/11/2026 noon"
    body = {"sensor": f"s{n % 97}", "reading": n / 7, "at": at, "crash": n in crash}
    return json.dumps(body).encode()


def crash(flag: bool | None) -> bool:
    """A plain UDF's function that kills its Python worker on a flagged event."""
    if flag:
        os._exit(3)
    return False


crashes = F.udf(lambda flag: crash(flag), BooleanType())  # no type hints for PySpark to read


def events(batch: DataFrame) -> DataFrame:
    parsed = F.from_json(F.col("body").cast("string"), EVENT)
    rows = batch.select("sequence_number", parsed.alias("e"))
    return rows.select(
        "sequence_number",
        "e.sensor",
        "e.reading",
        F.col("e.at").cast("timestamp").alias("at"),
        crashes(F.col("e.crash")).alias("crashed"),
    )


def fill(
    broker: poisonq.Broker, queue: str, count: int, bad: frozenset[int], crash: frozenset[int]
) -> None:
    broker.create_queue(queue, max_delivery_count=DELIVERIES, lock_duration=300)
    sender = broker.sender(queue)
    for start in range(0, count, SEND_BATCH):
        sender.send(
            [
                poisonq.Message(body=event(n, bad, crash))
                for n in range(start, min(count, start + SEND_BATCH))
            ]
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--scenario", action="append", help="clean, cast, crash, five_casts")
    args = parser.parse_args()
    batch = args.batch
    where = 6 * batch // 10  # a bad row past the middle of its batch
    spread = frozenset(range(batch // 7, 2 * batch, 2 * batch // 5))  # five of them
    scenarios = {
        "cast": (batch, frozenset({where}), frozenset()),
        "crash": (batch, frozenset(), frozenset({where})),
        "five_casts": (2 * batch, spread, frozenset()),
    }
    chosen = args.scenario or list(scenarios)
    if "demo" in chosen:
        demo_ratio()
        chosen.remove("demo")
        if not chosen:
            return
    root = Path(tempfile.mkdtemp(prefix="poisonq-bench-"))
    url = f"sqlite:///{root / 'bench.db'}"
    spark = local_session("poisonq-bench")
    try:
        with poisonq.connect(url) as broker:
            for name, (count, bad, crash) in scenarios.items():
                if name in chosen:
                    fill(broker, name, count, bad, crash)
                    fill(broker, f"{name}_clean", count, frozenset(), frozenset())
            fill(broker, "warmup", 1_000, frozenset(), frozenset())

        def run(queue: str) -> tuple[float, int, int]:
            pipeline = Pipeline(
                spark, url=url, queue=queue, transform=events,
                output=str(root / "out" / queue), batch_size=batch,
            )  # fmt: skip
            started = time.monotonic()
            report = pipeline.run()
            dead = report.dead_lettered.total()
            return time.monotonic() - started, report.isolation_jobs, dead

        run("warmup")
        for name in chosen:
            count = scenarios[name][0]
            clean, _, _ = run(f"{name}_clean")
            wall, jobs, dead = run(name)
            per_batch = clean / (count / batch)
            print(
                f"scenario={name} messages={count} batch={batch} wall_s={wall:.1f}"
                f" clean_s={clean:.1f} extra_s={wall - clean:.1f}"
                f" extra_per_clean_batch={(wall - clean) / per_batch:.2f}"
                f" ratio={wall / clean:.2f} isolation_jobs={jobs} dead_lettered={dead}",
                flush=True,
            )
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def demo_ratio() -> None:
    """Time ``poisonq demo`` against the same demo without its job-failing orders."""
    poisonq_cli = Path(sys.executable).with_name("poisonq")
    walls = []
    for extra in (["--without-job-failing"], []):
        with tempfile.TemporaryDirectory(prefix="poisonq-demo-") as directory:
            started = time.monotonic()
            command = [str(poisonq_cli), "demo", "--dir", directory, *extra]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:  # a check of the demo failed: show its end
                raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}")
            walls.append(time.monotonic() - started)
    clean, wall = walls
    print(
        f"scenario=demo orders=200000 wall_s={wall:.1f} clean_s={clean:.1f}"
        f" extra_s={wall - clean:.1f} ratio={wall / clean:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
