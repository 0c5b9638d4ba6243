"""The main job behind ``make demo``: purchase orders through a Spark SQL pipeline.

It sends orders to a fresh SQLite queue, runs :class:`~poisonq.spark.pipeline.Pipeline` on a
local Spark into Parquet, and proves the promise: every order is in the output table exactly
once or in the dead-letter queue with the reason its failure deserves, and the ledger
balances. Then it analyses the dead-letter queue with Spark SQL through the data source.

The transform is what a data engineer writes anyway: ``from_json`` of the bodies, a join with
the customer table, a cast of the total to a decimal, expectations on the result, and two
Python UDFs, one of them a :func:`poisonq.spark.udf`. The feed is bad in every way a real one
is, and each way ends where it should:

| kind      | share  | what goes wrong                                  | expected end          |
|-----------|--------|--------------------------------------------------|-----------------------|
| good      | rest   | nothing                                          | one output row        |
| malformed | 0.2 %  | the body is cut off: ``from_json`` gives NULLs   | ExpectationFailed     |
| invalid   | 1 %    | unknown customer: the join finds none, the UDF   | UnknownCustomerError  |
|           |        | raises a PermanentError                          |                       |
| negative  | 0.3 %  | a negative total                                 | ExpectationFailed     |
| flaky     | 2 %    | the UDF finds the warehouse locked on delivery 1 | one output row        |
| comma     | 1      | total ``"12,50"``: the ANSI cast fails the job   | CAST_INVALID_INPUT    |
| crash     | 1      | a plain UDF kills its Python worker              | MaxDeliveryCount...   |
| expiring  | 0.5 %  | sent with a 1 ms time to live                    | TTLExpiredException   |

The comma and crash orders fail the whole Spark job, so the runner isolates them by jobs
over the batch read once, on their first delivery. The comma order's cast error depends only
on its data: it is dead-lettered ``CAST_INVALID_INPUT`` at once, the value in its description.
The crash may not come again: it is retried, run alone before its next batches, until
``MaxDeliveryCountExceeded``, with the worker's exit as description. ``poisonq demo
--without-job-failing`` runs the same feed without these two, to time what they cost.
``poisonq demo --map`` runs the same checks over the per-row ``map`` pipeline instead
(:mod:`poisonq.spark.demo_map`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from poisonq.demo import (
    CUSTOMERS,
    QUEUE,
    WAREHOUSES,
    Order,
    UnknownCustomerError,
)
from poisonq.model import DeadLetterReason
from poisonq.spark.demo_runner import (
    POISONED,
    Expected,
    Job,
    WarehouseLockedError,
    run,
)
from poisonq.spark.expectations import REASON as EXPECTATION_FAILED
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.udf import udf

# --- The DataFrame job -------------------------------------------------------------------

ORDER_SCHEMA = (
    "order_id string, customer string, warehouse string,"
    " items array<struct<sku: string, quantity: int>>, total string"
)
SEGMENTS = ("retail", "wholesale", "partner")
REGIONS = ("eu", "us", "apac")


def encode(order: Order, fields: dict[str, Any]) -> bytes:
    """An order as the feed sends it: the total as text, to keep its cents exact, and the
    bad kinds bad in their own ways."""
    total = fields["total"]
    if order.kind == "negative":
        total = -total
    fields["total"] = f"{total:.2f}".replace(".", "," if order.kind == "comma" else ".")
    body = json.dumps(fields).encode()
    return body[: len(body) // 2] if order.kind == "malformed" else body


def customers(spark: SparkSession) -> DataFrame:
    """The customer table the orders are joined with (the demo's ``cust-0`` … ``cust-499``)."""
    rows = [
        (f"cust-{n}", f"Customer {n}", SEGMENTS[n % len(SEGMENTS)], REGIONS[n % len(REGIONS)])
        for n in range(CUSTOMERS)
    ]
    schema = "customer string, name string, segment string, region string"
    return spark.createDataFrame(rows, schema)


def reserve(
    customer: str | None, segment: str | None, warehouse: str | None, delivery_count: int
) -> str | None:
    """Reserve the order's stock (a stand-in for a call to the warehouse system), run as a
    :func:`poisonq.spark.udf`: an unknown customer is permanent and dead-letters its order
    with its own reason; a locked warehouse row is transient, so the order is retried."""
    if customer is None:  # the body did not parse: the expectations dead-letter it
        return None
    if segment is None:  # the join found no customer
        raise UnknownCustomerError(f"unknown customer {customer!r}")
    if warehouse == WAREHOUSES["flaky"] and delivery_count == 1:
        raise WarehouseLockedError(f"could not lock the stock row of warehouse {warehouse}")
    return f"{warehouse}/{segment}"


def locate_bin(warehouse: str | None) -> str | None:
    """The bin the order is picked from, as a native library would find it, run as a plain
    Python UDF: it aborts the process on warehouse north's corrupt index, which fails the
    Spark job, so the runner has to find the order by bisection."""
    if warehouse == WAREHOUSES["crash"]:
        os._exit(134)  # as a native library that aborts would
    return None if warehouse is None else f"{warehouse}-{len(warehouse) % 7}"


class OrderTransform:
    """``transform=`` of the DataFrame job: the lease's messages to order rows, in Spark SQL
    but for the two UDFs. Built once per pipeline, with the customer table it joins."""

    def __init__(self, customers: DataFrame) -> None:
        self.customers = F.broadcast(customers)
        self.reserve = udf(reserve, "string")
        self.locate_bin = F.udf(locate_bin, "string", useArrow=True)

    def __call__(self, batch: DataFrame) -> DataFrame:
        orders = batch.selectExpr(
            "sequence_number",
            "delivery_count",
            f"from_json(CAST(body AS STRING), '{ORDER_SCHEMA}') AS o",
        ).select("sequence_number", "delivery_count", "o.*")
        enriched = orders.join(self.customers, "customer", "left")
        columns: list[Column | str] = [
            "sequence_number",
            "order_id",
            "customer",
            "name",
            "segment",
            "region",
            "warehouse",
            F.expr("size(items)").alias("lines"),
            F.expr("aggregate(items, 0, (n, item) -> n + item.quantity)").alias("units"),
            # ANSI SQL: "12,50" is no decimal, and fails the job.
            F.expr("CAST(total AS DECIMAL(10, 2))").alias("total"),
            self.reserve("customer", "segment", "warehouse", "delivery_count").alias("reservation"),
            self.locate_bin("warehouse").alias("bin"),
        ]
        return enriched.select(*columns)


EXPECTATIONS = {
    "parsed": "order_id IS NOT NULL AND customer IS NOT NULL AND lines > 0",
    "positive_total": "total > 0",
}


def dataframe_pipeline(spark: SparkSession, url: str, output: str) -> Pipeline:
    return Pipeline(
        spark,
        url=url,
        queue=QUEUE,
        transform=OrderTransform(customers(spark)),
        expectations=EXPECTATIONS,
        output=output,
        batch_size=50_000,
    )


DATAFRAME_JOB = Job(
    title="Spark SQL transform",
    shares={
        "malformed": 0.002,
        "invalid": 0.01,
        "negative": 0.003,
        "flaky": 0.02,
        "comma": 1,
        "crash": 1,
        "expiring": 0.005,
    },
    expected={
        "malformed": Expected(EXPECTATION_FAILED, "parsed"),
        "invalid": Expected(UnknownCustomerError.__name__, "unknown customer"),
        "negative": Expected(EXPECTATION_FAILED, "failed expectation positive_total;"),
        "comma": Expected("CAST_INVALID_INPUT", 'cannot be cast to "DECIMAL'),
        "crash": Expected(POISONED, "WorkerCrashed"),
        "expiring": Expected(DeadLetterReason.TTL_EXPIRED.value),
    },
    pipeline=dataframe_pipeline,
    encode=encode,
    job_failing=("comma", "crash"),
)


def main(
    directory: Path = Path("demo"),
    orders: int = 200_000,
    seed: int = 7,
    map: bool = False,
    without_job_failing: bool = False,
) -> None:
    """Run the demo in ``directory`` (its store and output are replaced), the Spark SQL job
    or with ``map`` the per-row one, ``without_job_failing`` orders if asked (to time it
    against the full feed); raise ``SystemExit(1)`` if any check fails."""
    if map:
        from poisonq.spark.demo_map import MAP_JOB as job
    else:
        job = DATAFRAME_JOB
    run(job.without_job_failing() if without_job_failing else job, directory, orders, seed)
