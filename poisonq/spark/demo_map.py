"""``poisonq demo --map``: the demo's orders through the per-row ``map`` pipeline.

The function of one message is Python from end to end, and runs under the crash guard, so a
crash is found without a Spark job: each kind ends as in the main demo (:mod:`poisonq.spark.demo`).

| kind     | share | what the function does                        | expected end              |
|----------|-------|-----------------------------------------------|---------------------------|
| good     | rest  | validates and flattens it                     | one output row            |
| invalid  | 1 %   | unknown customer: raises a PermanentError     | dead-lettered at once     |
| flaky    | 2 %   | a transient lock error on the first attempt   | one output row (attempt 2)|
| crash    | 0.1 % | kills the Python process that transforms it   | MaxDeliveryCountExceeded  |
| expiring | 0.5 % | sent with a 1 ms time to live                 | TTLExpiredException       |
"""

from __future__ import annotations

import json
import os
from typing import Any

from pyspark.sql import SparkSession

from poisonq.demo import CUSTOMERS, QUEUE, WAREHOUSES, UnknownCustomerError
from poisonq.model import DeadLetterReason
from poisonq.spark.demo_runner import POISONED, Expected, Job, WarehouseLockedError
from poisonq.spark.pipeline import Pipeline

SCHEMA = "order_id string, customer string, warehouse string, lines int, total double"
KNOWN_CUSTOMERS = frozenset(f"cust-{n}" for n in range(CUSTOMERS))


def transform(message: dict[str, Any]) -> dict[str, Any]:
    """Validate and flatten one order (runs on executors, one message at a time)."""
    order = json.loads(message["body"])
    if order["customer"] not in KNOWN_CUSTOMERS:
        raise UnknownCustomerError(f"unknown customer {order['customer']!r}")
    if order["warehouse"] == WAREHOUSES["flaky"] and message["delivery_count"] == 1:
        raise WarehouseLockedError("could not lock the stock row of warehouse east")
    if order["warehouse"] == WAREHOUSES["crash"]:
        os._exit(134)  # as a native library that aborts would
    return {
        "order_id": order["order_id"],
        "customer": order["customer"],
        "warehouse": order["warehouse"],
        "lines": len(order["items"]),
        "total": order["total"],
    }


def map_pipeline(spark: SparkSession, url: str, output: str) -> Pipeline:
    return Pipeline(
        spark, url=url, queue=QUEUE, map=transform, schema=SCHEMA, output=output, batch_size=50_000
    )


MAP_JOB = Job(
    title="per-row map",
    shares={"invalid": 0.01, "flaky": 0.02, "crash": 0.001, "expiring": 0.005},
    expected={
        "invalid": Expected(UnknownCustomerError.__name__, "unknown customer"),
        "crash": Expected(POISONED, "WorkerCrashed"),
        "expiring": Expected(DeadLetterReason.TTL_EXPIRED.value),
    },
    pipeline=map_pipeline,
)
