"""The pipeline runner writing through the user's function ``write(frame, batch)`` (its
``output=``), on a real local SparkSession and real SQLite files."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from poisonq import Broker, Message
from poisonq.errors import InvalidOptionError
from poisonq.spark import Pipeline, PipelineStoppedError
from tests.helpers import assert_balanced, dead_letters_by_id, spark_store_url

cloudpickle.register_pickle_by_value(sys.modules[__name__])

url = spark_store_url


def amounts(frame: DataFrame) -> DataFrame:
    """A total as text cast to a number: ``"12,50"`` fails the job (ANSI)."""
    order = F.from_json(F.col("body").cast("string"), "n long, total string")
    parsed = frame.select("sequence_number", order.alias("o"))
    return parsed.select("sequence_number", "o.n", F.col("o.total").cast("double").alias("total"))


class Table:
    """A user's sink: one Parquet directory a batch number, overwritten, as the rule asks;
    it remembers each call's number and row count."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[int, int]] = []

    def __call__(self, frame: DataFrame, batch: int) -> None:
        path = str(self.root / f"batch={batch}")
        frame.write.mode("overwrite").parquet(path)
        # What was written, read back: the frame counted again would read its lease again.
        self.calls.append((batch, frame.sparkSession.read.parquet(path).count()))

    def rows(self, spark: SparkSession) -> Counter[int]:
        return Counter(r.n for r in spark.read.parquet(str(self.root)).select("n").collect())


def send(broker: Broker, count: int, bad: frozenset[int] = frozenset(), lock: float = 60) -> None:
    broker.create_queue("orders", lock_duration=lock)
    totals = {n: "12,50" if n in bad else f"{n}.5" for n in range(count)}
    broker.sender("orders").send(
        [
            Message(body=json.dumps({"n": n, "total": t}), message_id=f"o{n}")
            for n, t in totals.items()
        ]
    )


def test_the_function_gets_each_batch_once_and_isolation_never_calls_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Each batch's good rows reach the function once, with the batch's number; the jobs
    that isolate a failing row run the transform without calling it, and the row is
    dead-lettered by its data error."""
    send(live, 40, bad=frozenset({13}))
    table = Table(tmp_path / "table")
    report = Pipeline(
        spark, url=url, queue="orders", transform=amounts, output=table, batch_size=25
    ).run()
    assert report.isolation_jobs > 0
    assert table.calls == [(1, 24), (2, 15)]
    assert table.rows(spark) == Counter(set(range(40)) - {13})
    assert list(dead_letters_by_id(live)) == ["o13"]
    assert report.dead_lettered == {"CAST_INVALID_INPUT": 1}
    assert_balanced(live)


def test_a_replayed_batch_comes_again_with_its_number_and_one_that_ran_out_with_no_rows(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A batch a dead run wrote and never completed is written again under its own number;
    a batch whose locks ran out before completion is called with no rows under its number,
    so a function that replaces by number leaves every row once."""
    send(live, 30, lock=1)
    table = Table(tmp_path / "table")
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=amounts, output=table, batch_size=20,
        lock_duration=30,
    )  # fmt: skip
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20, lock_duration=1)
    assert lease is not None
    pipeline.writer.write_once(lease)  # then the driver died, and stayed down past the locks
    time.sleep(1.2)
    pipeline.run()
    assert table.calls[:2] == [(1, 20), (1, 0)]  # written, then emptied by the next run
    assert table.rows(spark) == Counter(range(30))
    assert live.counts("orders")["completed"] == 30
    assert_balanced(live)


def test_a_function_that_raises_stops_the_run_and_spends_nothing(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """An error the function raises on its own (not in a Spark job) is the sink's defect,
    whatever the batch held: the run stops naming it, and the batch's messages go back to
    the queue without a delivery counted."""
    send(live, 20)

    def refuse(frame: DataFrame, batch: int) -> None:
        raise ConnectionRefusedError("warehouse is down")

    pipeline = Pipeline(spark, url=url, queue="orders", transform=amounts, output=refuse)
    with pytest.raises(PipelineStoppedError, match="warehouse is down") as stopped:
        pipeline.run()
    assert stopped.value.report.isolation_jobs == 0
    counts = live.counts("orders")
    assert (counts["active"], counts["completed"], counts["dead_lettered"]) == (20, 0, 0)
    assert {m.delivery_count for m in live.peek("orders", max_messages=20)} == {0}
    assert_balanced(live)


def test_an_output_is_a_directory_or_a_function(spark: SparkSession, url: str) -> None:
    """``output=`` is a path or a function of a batch; a format goes only with a path."""
    with pytest.raises(InvalidOptionError, match="output= is a directory's path or a function"):
        Pipeline(spark, url=url, queue="orders", transform=amounts, output=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="output_format= goes with an output directory"):
        Pipeline(
            spark, url=url, queue="orders", transform=amounts, output=print, output_format="csv"
        )
