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
| comma     | 1      | total ``"12,50"``: the ANSI cast fails the job   | MaxDeliveryCount...   |
| crash     | 1      | a plain UDF kills its Python worker              | MaxDeliveryCount...   |
| expiring  | 0.5 %  | sent with a 1 ms time to live                    | TTLExpiredException   |

The comma and crash orders fail the whole Spark job, so the runner bisects the batch to find
them, about two jobs per halving, on their first delivery (after that they come back as
suspects and are tried alone): there is one of each, so that the demo takes two minutes on
two cores. Both are dead-lettered with the error of the job they failed alone (the cast
error, the worker's exit) as description. ``poisonq demo --map`` runs the same
checks over the per-row ``map`` pipeline instead (:mod:`poisonq.spark.demo_map`).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table
from rich.text import Text

from poisonq.client import Broker, connect
from poisonq.demo import (
    CUSTOMERS,
    QUEUE,
    WAREHOUSES,
    Encoder,
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
from poisonq.spark.expectations import REASON as EXPECTATION_FAILED
from poisonq.spark.pipeline import Pipeline, PipelineReport
from poisonq.spark.session import local_session
from poisonq.spark.udf import udf

MAX_DELIVERY_COUNT = 3
POISONED = DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED.value


@dataclass(frozen=True)
class Expected:
    """Where a bad kind of order must end: its dead-letter reason, and a piece of the
    description that shows it ended there for the right cause (empty: any)."""

    reason: str
    because: str = ""


@dataclass(frozen=True)
class Job:
    """One way to run the demo: the feed, where each bad kind must end, and the pipeline."""

    title: str
    shares: Mapping[str, float]
    expected: Mapping[str, Expected]
    pipeline: Callable[[SparkSession, str, str], Pipeline]  # (spark, url, output)
    encode: Encoder | None = None


class WarehouseLockedError(Exception):
    """A transient failure: the warehouse row was locked; a retry succeeds."""


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
        "comma": Expected(POISONED, "CAST_INVALID_INPUT"),
        "crash": Expected(POISONED, "BatchJobFailed"),
        "expiring": Expected(DeadLetterReason.TTL_EXPIRED.value),
    },
    pipeline=dataframe_pipeline,
    encode=encode,
)

# --- Running a job and checking it ---------------------------------------------------------


def check(
    broker: Broker, orders: list[Order], written: Counter[str], expected: Mapping[str, Expected]
) -> list[tuple[str, bool]]:
    """The demo's claims, each with whether it holds."""
    letters = list(dead_lettered(broker))
    dead = {m.message_id: m for m in letters}
    dead_count = Counter(m.message_id for m in letters)
    counts = broker.counts(QUEUE)

    def ended_right(order: Order) -> bool:
        letter, end = dead.get(order.order_id), expected[order.kind]
        return (
            letter is not None
            and dead_count[order.order_id] == 1
            and letter.dead_letter_reason == end.reason
            and end.because in (letter.dead_letter_error_description or "")
            and order.order_id not in written
        )

    return [
        (
            "good and flaky orders in the output exactly once",
            all(
                written[o.order_id] == 1 and o.order_id not in dead
                for o in orders
                if o.kind not in expected
            ),
        ),
        (
            "bad orders dead-lettered once with the expected reason, never written",
            all(ended_right(o) for o in orders if o.kind in expected),
        ),
        ("nothing else written", set(written) <= {o.order_id for o in orders}),
        ("nothing left in the queue", sum(counts[state] for state in HELD_STATES) == 0),
        ("audit: every message accounted for", broker.audit().ok),
    ]


def summary(title: str, orders: list[Order], report: PipelineReport) -> Table:
    table = Table(title=f"pipeline summary: {title}")
    table.add_column("what")
    table.add_column("value", justify="right")
    kinds = Counter(o.kind for o in orders)
    for what, value in (
        ("orders sent", len(orders)),
        *((f"  of them {kind}", n) for kind, n in sorted(kinds.items()) if kind != "good"),
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


def main(
    directory: Path = Path("demo"), orders: int = 200_000, seed: int = 7, map: bool = False
) -> None:
    """Run the demo in ``directory`` (its store and output are replaced), the Spark SQL job
    or with ``map`` the per-row one; raise ``SystemExit(1)`` if any check fails."""
    if map:
        from poisonq.spark.demo_map import MAP_JOB as job
    else:
        job = DATAFRAME_JOB
    run(job, directory, orders, seed)


class _OneLine(logging.Handler):
    """Shows the runner's warnings on the demo's console, one line each."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(Text(record.getMessage(), style="yellow"), soft_wrap=True)


@contextmanager
def _runner_warnings(console: Console) -> Iterator[None]:
    logger = logging.getLogger("poisonq.spark.pipeline")
    handler = _OneLine(console)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def run(job: Job, directory: Path, orders: int, seed: int) -> None:
    """Send the job's feed, run its pipeline, check and show what became of every order."""
    console = Console()
    url = fresh_store(directory)
    output = str(directory.resolve() / "orders.parquet")
    generated = make_orders(orders, random.Random(seed), dict(job.shares))
    with console.status("starting Spark"):
        spark = local_session("poisonq-demo")
    with connect(url) as broker:
        broker.create_queue(QUEUE, max_delivery_count=MAX_DELIVERY_COUNT, lock_duration=60)
        send_orders(broker, generated, console, seed, job.encode)
        pipeline = job.pipeline(spark, url, output)
        with console.status("running the pipeline") as status, _runner_warnings(console):
            report = pipeline.run(
                progress=lambda r: status.update(
                    f"running the pipeline: {r.completed:,} written,"
                    f" {sum(r.dead_lettered.values()):,} dead-lettered"
                )
            )
        written = Counter(
            row.order_id for row in spark.read.parquet(output).select("order_id").collect()
        )
        results = check(broker, generated, written, job.expected)
        console.print(summary(job.title, generated, report))
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
