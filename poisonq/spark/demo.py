"""The main job behind ``make demo``: purchase orders through the Spark pipeline.

It sends orders to a fresh SQLite queue, runs :class:`~poisonq.spark.pipeline.Pipeline` on a
local Spark into Parquet, and proves the promise: every order is in the output table exactly
once or in the dead-letter queue with the reason its failure deserves, and the ledger
balances. Then it analyses the dead-letter queue with Spark SQL through the data source.

| kind     | share | what the transform does                       | expected end              |
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
import random
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from poisonq.client import Broker, connect
from poisonq.demo import (
    CUSTOMERS,
    QUEUE,
    WAREHOUSES,
    Order,
    UnknownCustomerError,
    dead_lettered,
    fresh_store,
    make_orders,
    print_inspection,
    report_checks,
    send_orders,
)
from poisonq.model import HELD_STATES, DeadLetterReason
from poisonq.spark.pipeline import Pipeline, PipelineReport
from poisonq.spark.session import local_session

SHARES = {"invalid": 0.01, "flaky": 0.02, "crash": 0.001, "expiring": 0.005}
EXPECTED_REASON = {
    "invalid": UnknownCustomerError.__name__,
    "crash": DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED.value,
    "expiring": DeadLetterReason.TTL_EXPIRED.value,
}
SCHEMA = "order_id string, customer string, warehouse string, lines int, total double"
KNOWN_CUSTOMERS = frozenset(f"cust-{n}" for n in range(CUSTOMERS))


class WarehouseLockedError(Exception):
    """A transient failure: the warehouse row was locked; a retry succeeds."""


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


def check(broker: Broker, orders: list[Order], written: Counter[str]) -> list[tuple[str, bool]]:
    """The demo's claims, each with whether it holds."""
    letters = list(dead_lettered(broker))
    dead = {m.message_id: m.dead_letter_reason for m in letters}
    dead_count = Counter(m.message_id for m in letters)
    counts = broker.counts(QUEUE)
    return [
        (
            "good and flaky orders in the output exactly once",
            all(
                written[o.order_id] == 1 and o.order_id not in dead
                for o in orders
                if o.kind not in EXPECTED_REASON
            ),
        ),
        (
            "bad orders dead-lettered once with the expected reason, never written",
            all(
                dead_count[o.order_id] == 1
                and dead[o.order_id] == EXPECTED_REASON[o.kind]
                and o.order_id not in written
                for o in orders
                if o.kind in EXPECTED_REASON
            ),
        ),
        ("nothing left in the queue", sum(counts[state] for state in HELD_STATES) == 0),
        ("audit: every message accounted for", broker.audit().ok),
    ]


def summary(orders: int, report: PipelineReport) -> Table:
    table = Table(title="pipeline summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in (
        ("orders sent", orders),
        ("micro-batches", report.batches),
        ("messages leased (with retries)", report.leased),
        ("written and completed", report.completed),
        ("retried", report.retried),
        *((f"dead-lettered: {reason}", n) for reason, n in sorted(report.dead_lettered.items())),
        ("isolation jobs", report.isolation_jobs),
    ):
        table.add_row(what, f"{value:,}")
    table.add_row("processing time", f"{report.elapsed:.1f} s")
    table.add_row("messages / s", f"{report.messages_per_second:,.0f}")
    return table


def main(directory: Path = Path("demo"), orders: int = 200_000, seed: int = 7) -> None:
    """Run the demo in ``directory`` (its store and output are replaced); raise
    ``SystemExit(1)`` if any check fails."""
    console = Console()
    url = fresh_store(directory)
    output = directory.resolve() / "orders.parquet"
    generated = make_orders(orders, random.Random(seed), SHARES)
    with console.status("starting Spark"):
        spark = local_session("poisonq-demo")
    with connect(url) as broker:
        broker.create_queue(QUEUE, max_delivery_count=3, lock_duration=60)
        send_orders(broker, generated, console, seed)
        pipeline = Pipeline(
            spark,
            url=url,
            queue=QUEUE,
            map=transform,
            schema=SCHEMA,
            output=str(output),
            batch_size=50_000,
        )
        with console.status("running the pipeline") as status:
            report = pipeline.run(
                progress=lambda r: status.update(
                    f"running the pipeline: {r.completed:,} written,"
                    f" {sum(r.dead_lettered.values()):,} dead-lettered"
                )
            )
        written = Counter(
            row.order_id for row in spark.read.parquet(str(output)).select("order_id").collect()
        )
        results = check(broker, generated, written)
        console.print(summary(orders, report))
        console.print("\nThe dead-letter queue, read by Spark SQL through the data source:")
        dlq = spark.read.format("poisonq").option("url", url).option("queue", QUEUE)
        dlq.option("subqueue", "deadletter").load().createOrReplaceTempView("dead_letters")
        spark.sql(
            "SELECT dead_letter_reason, last_error_type, count(*) AS messages"
            " FROM dead_letters GROUP BY 1, 2 ORDER BY 3 DESC"
        ).show(truncate=False)
        console.print(f"Output: {output} ({sum(written.values()):,} rows)")
        print_inspection(console, broker, url)
    report_checks(console, results)
