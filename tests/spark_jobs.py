"""The Spark programs the cluster and Spark Connect tests run, each in a process of its own
(one SparkContext per process; the suite's local session lives in pytest's).

``python tests/spark_jobs.py JOB TARGET URL OUTPUT [CHECKPOINT]``: on a standalone cluster
the test starts it with ``spark-submit --master spark://...`` and TARGET is ``cluster`` (the
session comes from spark-submit); against a Spark Connect server TARGET is its ``sc://`` URL.
Every job works on the queue ``orders`` of ``tests.chaos.scenarios.send_orders``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from poisonq.spark import Pipeline
from tests.chaos import children

PROGRAM = Path(__file__).resolve()
ROOT = PROGRAM.parents[1]
TIMEOUT = 300  # seconds a job may take
KIND = "get_json_object(cast(body AS string), '$.kind')"


def environment() -> dict[str, str]:
    """A job's: the checkout importable (``tests.chaos``), Python workers on this
    interpreter."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def session(target: str) -> SparkSession:
    if target.startswith("sc://"):
        return SparkSession.builder.remote(target).getOrCreate()
    spark = SparkSession.builder.appName("poisonq-cluster-test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def orders(batch: DataFrame) -> DataFrame:
    """The ``transform=`` of the pipeline job: a bad order fails the expectation."""
    return batch.select("sequence_number", "message_id", F.expr(KIND).alias("kind"))


def pipeline_map(spark: SparkSession, url: str, output: str) -> None:
    """The runner with ``map=`` (bad orders raise ``PermanentError``), in small batches."""
    Pipeline(
        spark, url=url, queue="orders", output=output, consumer="map", batch_size=300,
        map=children.parse, schema=children.ORDERS_SCHEMA,
    ).run()  # fmt: skip


def pipeline_transform(spark: SparkSession, url: str, output: str) -> None:
    """The runner with ``transform=`` and an expectation on the kind of order."""
    Pipeline(
        spark, url=url, queue="orders", output=output, consumer="frame", batch_size=300,
        transform=orders, expectations={"good": "kind = 'good'"},
    ).run()  # fmt: skip


def read(spark: SparkSession, url: str, output: str) -> None:
    """A batch read of the queue (a peek: nothing settled) written as Parquet."""
    frame = spark.read.format("poisonq").option("url", url).option("queue", "orders").load()
    frame.select("message_id").write.mode("overwrite").parquet(output)


def main() -> None:
    job, target, url, output, *rest = sys.argv[1:]
    spark = session(target)
    if job == "map":
        pipeline_map(spark, url, output)
    elif job == "transform":
        pipeline_transform(spark, url, output)
    elif job == "read":
        read(spark, url, output)
    elif job == "stream":
        children.stream_on(spark, url, "orders", output, rest[0])
    else:
        raise SystemExit(f"unknown job {job!r}")
    spark.stop()


if __name__ == "__main__":
    main()
