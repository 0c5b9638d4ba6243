"""Running one of the demo's jobs and checking what became of every order.

A job (:class:`Job`) is a feed of orders with shares of bad kinds, where each bad kind must
end (:class:`Expected`), and the pipeline to run; :func:`run` sends the feed, runs the
pipeline on a local Spark into Parquet, and proves the promise: every order is in the output
exactly once or in the dead-letter queue with the reason its failure deserves, and the
ledger balances. The jobs are :mod:`poisonq.spark.demo` (Spark SQL) and
:mod:`poisonq.spark.demo_map` (per-row).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table
from rich.text import Text

from poisonq.client import Broker, connect
from poisonq.demo import (
    QUEUE,
    Encoder,
    Order,
    dead_lettered,
    fresh_store,
    make_orders,
    print_inspection,
    report_checks,
    send_orders,
)
from poisonq.model import LIVE_STATES, DeadLetterReason
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.reports import PipelineReport
from poisonq.spark.session import local_session
from poisonq.timeline import per_second

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
    job_failing: tuple[str, ...] = ()  # the kinds that fail the whole Spark job

    def without_job_failing(self) -> Job:
        """The same job with a feed that has none of its job-failing kinds: what the demo
        costs without them, to compare with."""
        shares = {k: v for k, v in self.shares.items() if k not in self.job_failing}
        return replace(self, shares=shares)


class WarehouseLockedError(Exception):
    """A transient failure: the warehouse row was locked; a retry succeeds."""


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
        ("nothing left in the queue", sum(counts[state] for state in LIVE_STATES) == 0),
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
        ("given back (a defect)", report.released),
        *((f"dead-lettered: {reason}", n) for reason, n in sorted(report.dead_lettered.items())),
        ("isolation jobs", report.isolation_jobs),
    ):
        table.add_row(what, f"{value:,}")
    table.add_row("processing time", f"{report.elapsed:.1f} s")
    table.add_row("messages / s", per_second(report.messages_per_second))
    return table


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
