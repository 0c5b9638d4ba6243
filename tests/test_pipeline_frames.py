"""The pipeline runner with a DataFrame ``transform``, expectations and poisonq UDFs, on a
real local SparkSession and real SQLite files (PostgreSQL where marked)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import poisonq
from poisonq import Broker, Message
from poisonq.errors import InvalidOptionError
from poisonq.spark import Pipeline, PipelineStoppedError, udf
from poisonq.spark.reports import PipelineReport
from tests.helpers import assert_balanced, dead_letters_by_id, on_both_stores, spark_store_url

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ORDER = "n long, amount long, qty string, kind string"


class UnknownCustomer(poisonq.PermanentError):
    pass


def enrich(n: int | None, kind: str | None, delivery_count: int) -> str | None:
    if kind == "unknown":
        raise UnknownCustomer(f"order {n}: no such customer")
    if kind == "flaky" and delivery_count == 1:
        raise TimeoutError("customer service timed out")
    return None if n is None else f"C{n % 7}"


def orders(frame: DataFrame) -> DataFrame:
    """Parse, drop ``skip`` orders, split ``double`` orders in two rows, enrich with the UDF;
    ``ansi`` orders fail the job with a cast error, ``raise`` ones with raise_error."""
    customer = udf(enrich, "string")
    parsed = frame.select(
        "sequence_number",
        "delivery_count",
        F.from_json(F.col("body").cast("string"), ORDER).alias("o"),
    ).filter(F.coalesce(F.col("o.kind"), F.lit("")) != "skip")
    rows = parsed.withColumn(
        "part",
        F.explode(
            F.when(F.col("o.kind") == "double", F.array(F.lit(1), F.lit(2))).otherwise(
                F.array(F.lit(1))
            )
        ),
    )
    return rows.select(
        "sequence_number",
        "part",
        F.col("o.n").alias("n"),
        F.col("o.amount").alias("amount"),
        F.col("o.qty").cast("int").alias("qty"),
        F.when(F.col("o.kind") == "raise", F.raise_error(F.lit("refused"))).alias("refused"),
        customer(F.col("o.n"), F.col("o.kind"), F.col("delivery_count")).alias("customer"),
    )


EXPECT = {"parsed": "n IS NOT NULL", "positive": "amount > 0"}


url = spark_store_url


def send(broker: Broker, bodies: dict[int, str], count: int, **queue: Any) -> None:
    broker.create_queue("orders", lock_duration=60, **queue)
    broker.sender("orders").send(
        [
            Message(
                body=bodies.get(n, json.dumps({"n": n, "amount": n + 1, "qty": str(n)})),
                message_id=f"o{n}",
            )
            for n in range(count)
        ]
    )


def order(n: int, **fields: Any) -> str:
    return json.dumps({"n": n, "amount": n + 1, "qty": str(n), **fields})


def written(spark: SparkSession, path: Path) -> Counter[tuple[int, int]]:
    rows = spark.read.parquet(str(path)).select("n", "part").collect()
    return Counter((row.n, row.part) for row in rows)


@on_both_stores
def test_each_failure_of_a_dataframe_transform_fails_only_its_message(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    bodies = {
        2: "{not json",
        3: order(3, amount=-5),
        5: order(5, kind="unknown"),
        8: order(8, kind="flaky"),
        13: order(13, qty="thirteen"),
        21: order(21, kind="raise"),
        30: order(30, kind="skip"),
        34: order(34, kind="double"),
    }
    send(live, bodies, 40, max_delivery_count=2)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=orders, expectations=EXPECT,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    report = pipeline.run()  # what was abandoned comes back in later batches of the run
    assert report.dead_lettered["CAST_INVALID_INPUT"] == 1

    out = written(spark, tmp_path / "out")
    good = set(range(40)) - {2, 3, 5, 13, 21, 30}
    assert out == Counter({(n, 1): 1 for n in good} | {(34, 2): 1})
    found = dead_letters_by_id(live)
    assert {k: m.dead_letter_reason for k, m in found.items()} == {
        "o2": "ExpectationFailed",
        "o3": "ExpectationFailed",
        "o5": "UnknownCustomer",
        "o13": "CAST_INVALID_INPUT",
        "o21": "USER_RAISED_EXCEPTION",
    }
    assert "parsed" in (found["o2"].dead_letter_error_description or "")
    assert '"amount": -5' in (found["o3"].dead_letter_error_description or "")
    assert "positive" in (found["o3"].dead_letter_error_description or "")
    unknown = live.message("orders/$deadletterqueue", found["o5"].sequence_number)
    assert "raise UnknownCustomer" in unknown.failures[-1].traceback
    assert "poisonq/" not in unknown.failures[-1].traceback  # it starts at the user's code
    ansi = live.message("orders/$deadletterqueue", found["o13"].sequence_number)
    assert "CAST_INVALID_INPUT" in ansi.failures[-1].message
    assert ansi.failures[-1].fingerprint == "batch-job-failed:CAST_INVALID_INPUT"
    assert "'thirteen'" in (found["o13"].dead_letter_error_description or "")
    assert found["o13"].delivery_count == 1  # a data error is dead-lettered on its first isolation
    assert_balanced(live)


def test_a_message_with_one_failing_row_writes_none_even_from_other_partitions(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send(live, {}, 30)

    def scattered(frame: DataFrame) -> DataFrame:
        rows = frame.select(
            "sequence_number", F.explode(F.sequence(F.lit(1), F.lit(4))).alias("part")
        )
        parsed = frame.select(
            "sequence_number", F.from_json(F.col("body").cast("string"), ORDER).alias("o")
        )
        return (
            rows.join(parsed, "sequence_number")
            .repartition(4, "part")
            .select("sequence_number", "part", F.col("o.n").alias("n"))
        )

    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=scattered, output=str(tmp_path / "out"),
        expectations={"part 3 of order 7": "NOT (n = 7 AND part = 3)"},
    )  # fmt: skip
    pipeline.run()

    out = written(spark, tmp_path / "out")
    assert out == Counter({(n, part): 1 for n in range(30) if n != 7 for part in range(1, 5)})
    assert dead_letters_by_id(live)["o7"].dead_letter_reason == "ExpectationFailed"
    assert_balanced(live)


def test_an_expectation_every_row_fails_is_a_defect_not_poison(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send(live, {}, 40)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=orders, output=str(tmp_path / "out"),
        expectations={"typo": "amount < 0"}, batch_size=20,  # the second lease taken ahead
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="ExpectationFailed") as stopped:
        pipeline.run()
    assert "typo" in str(stopped.value)
    report = stopped.value.report
    assert (report.released, report.retried, report.completed) == (20, 0, 0)
    assert live.counts("orders")["active"] == 40
    assert {m.delivery_count for m in live.peek("orders", max_messages=100)} == {0}
    assert not dead_letters_by_id(live)


def test_a_poisonq_udf_that_fails_every_row_is_a_defect(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send(live, {}, 40)

    def broken(n: int) -> str:
        return n.decode()  # type: ignore[attr-defined]

    def transform(frame: DataFrame) -> DataFrame:
        body = F.col("body").cast("string")
        return frame.select(
            "sequence_number", udf(broken, "string")(F.get_json_object(body, "$.n"))
        )

    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=transform, output=str(tmp_path / "out")
    )
    with pytest.raises(PipelineStoppedError, match="AttributeError") as stopped:
        pipeline.run()
    assert "n.decode()" in stopped.value.traceback
    assert live.counts("orders")["active"] == 40
    assert not dead_letters_by_id(live)


def side_table_udf(frame: DataFrame) -> DataFrame:
    """A poisonq UDF applied to a table joined to the batch, which has no sequence number."""
    names = frame.sparkSession.createDataFrame([(1, "a")], "id long, name string")
    upper = names.select(udf(str.upper, "string")("name").alias("upper"))
    return frame.select("sequence_number").crossJoin(upper)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"transform": side_table_udf}, "apply it to the batch's rows"),
        ({"transform": lambda message: {"n": json.loads(message["body"])["n"]}}, "map="),
        ({"transform": lambda frame: frame.count()}, "returned a int"),
        ({"transform": lambda frame: frame.select("body")}, "sequence_number"),
        ({"transform": orders, "schema": "n long"}, "schema= goes with map="),
        ({"transform": orders, "ignore_extra_fields": True}, "ignore_extra_fields= goes with"),
        ({"transform": orders, "isolate": False}, "isolate= goes with map="),
        ({"transform": orders, "expectations": {"huh": "amount +"}}, "expectation 'huh'"),
        ({"transform": orders, "expectations": {"sum": "amount + 1"}}, "not a boolean"),
        ({"map": len, "schema": "n long", "expectations": EXPECT}, "transform="),
        ({"map": lambda message: message}, "schema="),
        ({}, "one of transform= .* map= .* or map_batches="),
    ],
)
def test_mistakes_in_a_pipeline_are_named_before_anything_runs(
    spark: SparkSession, url: str, tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        Pipeline(spark, url=url, queue="orders", output=str(tmp_path / "out"), **arguments)


def test_a_poisonq_udf_outside_a_pipeline_is_a_plain_udf(spark: SparkSession) -> None:
    double = udf(lambda n: n * 2, "long")
    assert spark.range(3).select(double("id").alias("d")).collect()[2].d == 4


def test_a_restart_replays_both_leases_a_dead_run_left_and_writes_once(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A run leases batch n+1 while batch n's job runs: dying then, it leaves batch n
    written but not completed, and batch n+1 leased but not run."""
    send(live, {}, 20)
    written_not_completed = live.acquire_lease("orders", "pipeline", 1, 12)
    leased_ahead = live.acquire_lease("orders", "pipeline", 2, 12)
    assert written_not_completed is not None and leased_ahead is not None
    stale = tmp_path / "out" / "consumer=pipeline" / "lease=1"
    spark.createDataFrame([(0, 1, 99)], "sequence_number long, part int, n long").write.parquet(
        str(stale)
    )
    report = Pipeline(
        spark, url=url, queue="orders", transform=orders, output=str(tmp_path / "out"),
        batch_size=5, lock_duration=2,  # a second to see that nothing renews the leases
    ).run()  # fmt: skip
    assert written(spark, tmp_path / "out") == Counter({(n, 1): 1 for n in range(20)})
    assert (report.completed, live.counts("orders")["completed"]) == (20, 20)
    assert_balanced(live)


def _crash_on_seven(n: int) -> int:
    if n == 7:
        os._exit(3)  # a worker crash: the task, and with it the job, fails
    return n


def test_a_worker_crash_in_a_plain_udf_is_isolated_to_its_message(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send(live, {}, 12, max_delivery_count=1)
    crash = F.udf(_crash_on_seven, "long", useArrow=False)

    def transform(frame: DataFrame) -> DataFrame:
        n = F.get_json_object(F.col("body").cast("string"), "$.n").cast("long")
        return frame.select("sequence_number", crash(n).alias("n"), F.lit(1).alias("part"))

    report = Pipeline(
        spark, url=url, queue="orders", transform=transform, output=str(tmp_path / "out")
    ).run()
    assert written(spark, tmp_path / "out") == Counter({(n, 1): 1 for n in range(12) if n != 7})
    crashed = dead_letters_by_id(live)["o7"]
    assert crashed.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert live.message("orders/$deadletterqueue", crashed.sequence_number).failures
    assert report.dead_lettered == Counter({"MaxDeliveryCountExceeded": 1})
    assert_balanced(live)


def test_small_batches_that_all_fail_the_same_way_stop_across_batches(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A batch of 5 never holds the 10 failures a task needs to tell a defect; the runner
    judges small batches together, so a bug stops the run after a few of them, with most
    messages untouched, instead of dead-lettering the whole queue."""
    send(live, {}, 40)
    pipeline = Pipeline(
        spark, url=url, queue="orders", transform=orders, output=str(tmp_path / "out"),
        expectations={"typo": "amount < 0"}, batch_size=5,
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="over the last batches") as stopped:
        pipeline.run()
    assert "--fingerprint expectation:typo" in str(stopped.value)
    dead_count = len(dead_letters_by_id(live))
    assert 10 <= dead_count <= 15
    assert live.counts("orders")["active"] == 40 - dead_count
    assert {m.delivery_count for m in live.peek("orders", max_messages=100)} == {0}
    assert_balanced(live)


def test_a_run_cut_short_in_a_batch_leaves_it_unfinished_and_the_next_run_replays_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Ctrl-C in a batch leaves its messages in their lease, reported unfinished (not
    retried), and the next run replays it with no delivery counted again."""
    send(live, {}, 30)

    def cut_short_in_lease_2(frame: DataFrame) -> DataFrame:
        if frame.agg(F.min("sequence_number")).first()[0] == 11:  # type: ignore[index]
            raise KeyboardInterrupt  # Ctrl-C while the driver builds lease 2's job
        return orders(frame)

    common: dict[str, Any] = {
        "url": url, "queue": "orders", "expectations": EXPECT,
        "output": str(tmp_path / "out"), "batch_size": 10,
    }  # fmt: skip
    seen: list[PipelineReport] = []
    cut = Pipeline(spark, transform=cut_short_in_lease_2, **common)
    with pytest.raises(KeyboardInterrupt):
        cut.run(progress=seen.append)
    report = seen[-1]
    assert (report.batches, report.leased, report.completed) == (2, 20, 10)
    assert (report.unfinished, report.retried, report.released) == (10, 0, 0)
    assert live.counts("orders")["locked"] == 10  # lease 2's, for the next run
    again = Pipeline(spark, transform=orders, **common).run()
    assert again.completed == 20 and again.retried == 0
    assert written(spark, tmp_path / "out") == Counter({(n, 1): 1 for n in range(30)})
    assert {m.delivery_count for m in live.peek("orders", max_messages=100)} <= {1}
    assert_balanced(live)
