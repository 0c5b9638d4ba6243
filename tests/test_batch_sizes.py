"""How many messages the pipeline runner leases for each batch (:mod:`poisonq.spark.batch_sizes`):
the rule as a table, and the runner following it on a real SparkSession and SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from poisonq import Broker, Message
from poisonq.spark.batch_sizes import FIRST, MOST, BatchSizes
from poisonq.spark.pipeline import Pipeline
from poisonq.timeline import BatchRun
from tests.helpers import assert_balanced, spark_store_url

url = spark_store_url


def _clean() -> BatchRun:
    return BatchRun(0.0, 1.0)


def _isolated() -> BatchRun:
    return BatchRun(0.0, 1.0, isolation_jobs=17)


@pytest.mark.parametrize(
    ("batch_size", "runs", "first", "sizes"),
    [
        # Left out: the first batch small, then what is ready up to MOST; a batch leased
        # after one that needed isolation jobs small again, until one runs clean.
        (None, [_clean(), _clean()], FIRST, [MOST, MOST, MOST]),
        (
            None,
            [_clean(), _isolated(), _isolated(), _clean()],
            FIRST,
            [MOST, MOST, FIRST, FIRST, MOST],
        ),
        # Given: every batch takes up to that many, failed or not.
        (5, [_clean(), _isolated(), _clean()], 5, [5, 5, 5, 5]),
    ],
)  # fmt: skip
def test_a_run_starts_small_grows_with_clean_batches_and_shrinks_after_a_failed_job(
    batch_size: int | None, runs: list[BatchRun], first: int, sizes: list[int]
) -> None:
    """``sizes`` are the sizes of the leases after the first, before each batch of ``runs``
    is noted and after the last."""
    rule = BatchSizes(batch_size)
    seen = [rule.next()]
    for run in runs:
        rule.ran(run)
        seen.append(rule.next())
    assert (rule.first, seen) == (first, sizes)


def _sequence_numbers(batch: DataFrame) -> DataFrame:
    return batch.select("sequence_number")


@pytest.mark.slow
def test_by_default_a_backlog_goes_in_a_small_first_batch_and_one_of_the_rest(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A run's first batch takes up to 100,000 of a backlog of 250,000, the next the other
    150,000 (up to 1,000,000 may go in one), each completed."""
    count = FIRST + 150_000
    live.create_queue("events", lock_duration=120)
    sender = live.sender("events")
    for _ in range(count // 50_000):
        sender.send([Message(body=b"{}") for _ in range(50_000)])
    pipeline = Pipeline(
        spark, url=url, queue="events", transform=_sequence_numbers, output=str(tmp_path / "out")
    )
    report = pipeline.run()
    batches = sorted(live.pipeline_batches("pipeline"), key=lambda batch: batch.lease)
    assert [(batch.size, batch.completed) for batch in batches] == [
        (FIRST, FIRST),
        (150_000, 150_000),
    ]
    assert (report.batches, report.completed) == (2, count)
    assert spark.read.parquet(str(tmp_path / "out")).count() == count
    assert_balanced(live)
