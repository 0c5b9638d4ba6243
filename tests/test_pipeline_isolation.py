"""What a row that fails the whole Spark job costs: the runner and ``foreach_batch`` find it
and settle it by what its error says, on a real local SparkSession and real SQLite files
(PostgreSQL where marked)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from poisonq import Broker, FailureRecord, Message
from poisonq.spark import Pipeline, foreach_batch
from tests.helpers import (
    assert_balanced,
    dead_letters_by_id,
    on_both_stores,
    spark_store_url,
    start_stream,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EVENT = "n long, at string, crash boolean"

url = spark_store_url


def send(broker: Broker, count: int, bad: dict[int, dict[str, Any]], **queue: Any) -> None:
    broker.create_queue("orders", lock_duration=60, **queue)
    bodies = {n: {"n": n, "at": "2026-11-26 12:00:00", **bad.get(n, {})} for n in range(count)}
    broker.sender("orders").send(
        [Message(body=json.dumps(body), message_id=f"o{n}") for n, body in bodies.items()]
    )


def _crash(flag: bool | None) -> bool:
    if flag:
        os._exit(3)  # the Python worker dies: the task, and with it the job, fails
    return False


def events(frame: DataFrame) -> DataFrame:
    """Parse; ``at`` is cast to a timestamp (ANSI: a malformed one fails the job), and a
    plain UDF kills its worker on ``crash`` events."""
    crashes = F.udf(_crash, "boolean", useArrow=False)
    parsed = frame.select(
        "sequence_number", F.from_json(F.col("body").cast("string"), EVENT).alias("e")
    )
    return parsed.select(
        "sequence_number",
        F.col("e.n").alias("n"),
        F.col("e.at").cast("timestamp").alias("at"),
        crashes(F.col("e.crash")).alias("crashed"),
    )


def _amount(text: str | None) -> str | None:
    if text == "many":
        raise ValueError(f"amount {text!r} is no number")
    return text


def _stamp(text: str | None) -> str | None:
    if text == "noon":
        raise ValueError(f"time {text!r} is no time")
    return text


def checked(frame: DataFrame) -> DataFrame:
    """Two plain UDFs that raise the same type, ``ValueError``, each in a place of its own:
    ``_amount`` for an ``amount`` of "many", ``_stamp`` for an ``at`` of "noon"."""
    parsed = frame.select(
        "sequence_number",
        F.from_json(F.col("body").cast("string"), "n long, at string, amount string").alias("e"),
    )
    return parsed.select(
        "sequence_number",
        F.col("e.n").alias("n"),
        F.udf(_amount, "string", useArrow=False)(F.col("e.amount")).alias("amount"),
        F.udf(_stamp, "string", useArrow=False)(F.col("e.at")).alias("at"),
    )


def written(spark: SparkSession, path: Path) -> Counter[int]:
    return Counter(row.n for row in spark.read.parquet(str(path)).select("n").collect())


@on_both_stores
def test_a_data_error_dead_letters_its_message_on_its_first_isolation_with_its_error_class(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A malformed timestamp fails the same way on every delivery: found alone, its message
    is dead-lettered at once, reason the Spark error class, description Spark's message with
    the value; the queue's max_delivery_count is not spent on it."""
    send(live, 20, {6: {"at": "26/11/2026 noon"}}, max_delivery_count=5)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=events, output=str(tmp_path / "out")
    )
    report = pipeline.run()

    assert written(spark, tmp_path / "out") == Counter(n for n in range(20) if n != 6)
    [dead] = dead_letters_by_id(live).values()
    assert (dead.message_id, dead.dead_letter_reason, dead.delivery_count) == (
        "o6",
        "CAST_INVALID_INPUT",
        1,
    )
    assert "'26/11/2026 noon'" in (dead.dead_letter_error_description or "")
    assert dead.failures[-1].fingerprint == "batch-job-failed:CAST_INVALID_INPUT"
    assert report.dead_lettered == Counter({"CAST_INVALID_INPUT": 1})
    assert_balanced(live)


def test_a_crash_found_alone_keeps_the_queues_retry_policy(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A worker's death may not happen again: its message is abandoned, delivered again
    until max_delivery_count, and only then dead-lettered."""
    send(live, 8, {3: {"crash": True}}, max_delivery_count=2)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=events, output=str(tmp_path / "out")
    )
    report = pipeline.run()

    assert written(spark, tmp_path / "out") == Counter(n for n in range(8) if n != 3)
    [dead] = dead_letters_by_id(live).values()
    assert (dead.message_id, dead.dead_letter_reason, dead.delivery_count) == (
        "o3",
        "MaxDeliveryCountExceeded",
        2,
    )
    assert [f.error_type for f in dead.failures] == ["WorkerCrashed"] * 2
    assert report.dead_lettered == Counter({"MaxDeliveryCountExceeded": 1})
    assert_balanced(live)


def test_foreach_batch_dead_letters_a_data_error_on_its_first_isolation(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """The same rule in a ``foreachBatch`` handler whose own Spark job fails on a cast."""
    send(live, 8, {5: {"at": "yesterday"}}, max_delivery_count=5)
    out = tmp_path / "out"

    def handle(df: DataFrame, batch_id: int) -> None:
        events(df).write.mode("append").parquet(str(out))

    query = start_stream(spark, url, tmp_path / "ck", foreach_batch(handle), "fb")
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    assert written(spark, out) == Counter(n for n in range(8) if n != 5)
    [dead] = dead_letters_by_id(live).values()
    assert (dead.message_id, dead.dead_letter_reason, dead.delivery_count) == (
        "o5",
        "CAST_INVALID_INPUT",
        1,
    )
    assert "'yesterday'" in (dead.dead_letter_error_description or "")
    assert_balanced(live)


def test_a_message_that_failed_a_job_alone_runs_alone_before_its_next_batch(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A crash comes back in a batch with new messages: it is run alone first and, failing
    the same way again, settled before the batch, which then runs without failing (one
    isolation job for the batch, no bisection)."""
    send(live, 20, {3: {"crash": True}}, max_delivery_count=3)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=events, output=str(tmp_path / "out"),
        batch_size=6,
    )  # fmt: skip
    pipeline.run()

    assert written(spark, tmp_path / "out") == Counter(n for n in range(20) if n != 3)
    # Lease 2 was taken while lease 1 ran; lease 3 holds the crash again and five new ones.
    batches = {batch.lease: batch for batch in live.pipeline_batches("pipeline")}
    assert batches[1].isolation_jobs > 1  # the batch failed: isolated by jobs
    assert (batches[3].size, batches[3].isolation_jobs, batches[3].completed) == (6, 1, 5)
    [dead] = dead_letters_by_id(live).values()
    assert (dead.message_id, dead.dead_letter_reason) == ("o3", "MaxDeliveryCountExceeded")
    assert_balanced(live)


def test_job_failures_group_by_the_python_type_and_the_frame_that_raised_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A job failure with a Python worker's traceback is fingerprinted by the exception's
    type and the frame that raised it, as ``map=`` failures are: two messages failing in one
    UDF share a group, the same type raised in another UDF is a group of its own."""
    bad = {2: {"amount": "many"}, 9: {"amount": "many"}, 5: {"at": "noon"}}
    send(live, 12, bad, max_delivery_count=1)
    Pipeline(spark, url=url, queue="orders", transform=checked, output=str(tmp_path / "out")).run()

    letters = dead_letters_by_id(live)
    prints = {key: letters[key].failures[-1].fingerprint for key in ("o2", "o9", "o5")}
    assert (
        prints["o2"]
        == prints["o9"]
        == "batch-job-failed:ValueError@test_pipeline_isolation.py:_amount"
    )
    assert prints["o5"] == "batch-job-failed:ValueError@test_pipeline_isolation.py:_stamp"
    assert "raise ValueError" in letters["o5"].failures[-1].traceback
    assert_balanced(live)


def test_a_job_failure_recorded_by_type_alone_still_runs_its_message_alone_first(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A message whose last failure was fingerprinted before fingerprints named the frame
    (``batch-job-failed:ValueError``) is read as that type: failing with it again, alone, it
    is settled before its batch, which then runs without failing (one isolation job)."""
    send(live, 12, {0: {"amount": "many"}}, max_delivery_count=3)
    record = FailureRecord(0.0, "BatchJobFailed", "ValueError: amount 'many' is no number",
                           fingerprint="batch-job-failed:ValueError")  # fmt: skip
    receiver = live.receiver("orders")
    receiver.abandon(receiver.receive(1), record)
    Pipeline(
        spark, url=url, queue="orders", transform=checked, output=str(tmp_path / "out"),
        batch_size=6,
    ).run()  # fmt: skip

    batches = {batch.lease: batch for batch in live.pipeline_batches("pipeline")}
    assert (batches[1].size, batches[1].isolation_jobs, batches[1].completed) == (6, 1, 5)
    assert written(spark, tmp_path / "out") == Counter(range(1, 12))
    assert_balanced(live)
