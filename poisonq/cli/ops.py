"""``poisonq audit`` and ``poisonq demo``: proving that no message was lost.

The Spark demo is imported only when it runs, so ``--engine`` and ``audit`` work without
the ``spark`` extra.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option, table
from poisonq.cli.paths import PathParam
from poisonq.cli.pipeline import require_pyspark
from poisonq.demo import main as run_demo
from poisonq.reports import AuditEntry, AuditReport


def _entry_json(entry: AuditEntry) -> dict[str, Any]:
    return {**dataclasses.asdict(entry), "ok": entry.ok}


def _audit_json(report: AuditReport) -> dict[str, Any]:
    entries = [_entry_json(e) for e in report.entries]
    totals = {"sent": report.sent, "completed": report.completed, "dropped": report.dropped}
    deleted = _entry_json(report.deleted)
    return {"ok": report.ok, **totals, "held": report.held, "entries": entries, "deleted": deleted}


def _audit_render(report: AuditReport) -> RenderableType:
    columns = ["entity", "sent", "moved in", "completed", "dropped", "moved out", "held", "ok"]
    rows = [
        [
            e.name,
            e.sent,
            e.moved_in,
            e.completed,
            e.dropped,
            e.moved_out,
            e.held,
            "yes" if e.ok else "NO",
        ]
        for e in report.rows
    ]
    verdict = "balanced" if report.ok else "OUT OF BALANCE"
    summary = Text(
        f"{verdict}: sent {report.sent} {'=' if report.balanced else '≠'} completed"
        f" {report.completed} + dropped "
        f"{report.dropped} + held {report.held}",
        style="green" if report.ok else "bold red",
    )
    return Group(table("ledger", columns, rows), summary)


@click.command()
@json_option
@click.pass_obj
def audit(app: App, /, as_json: bool) -> None:
    """Check that no message was lost.

    Every message ever sent must be completed, dropped or still held somewhere, and every
    entity's ledger must balance. Exit code 1 if not.
    """
    report = app.broker.audit()
    emit(app, as_json, _audit_json(report), lambda: _audit_render(report))
    if not report.ok:
        app.ctx.exit(1)


SPARK_DEMO_ORDERS = 200_000
ENGINE_DEMO_ORDERS = 20_000


@click.command()
@click.option(
    "--dir",
    "directory",
    type=PathParam(file_okay=False, path_type=Path),
    default=Path("demo"),
    show_default=True,
    help="Directory the demo works in (its previous store is replaced).",
)
@click.option(
    "--orders",
    type=click.IntRange(min=100),
    help="How many purchase orders to send "
    f"[default: {SPARK_DEMO_ORDERS} on Spark, {ENGINE_DEMO_ORDERS} with --engine].",
)
@click.option(
    "--engine",
    is_flag=True,
    help="Run the engine demo instead: a plain-Python Processor, no Spark.",
)
@click.option(
    "--map",
    "per_row",
    is_flag=True,
    help="Run the Spark pipeline with a per-row Python function (map=) instead of the"
    " Spark SQL transform.",
)
@click.option(
    "--without-job-failing",
    is_flag=True,
    help='Leave out the Spark demo\'s two orders that fail the whole Spark job (a "12,50"'
    " total and a crashing UDF), to time what they cost against a full run.",
)
def demo(
    directory: Path, orders: int | None, engine: bool, per_row: bool, without_job_failing: bool
) -> None:
    """Run the end-to-end demo.

    It sends purchase orders, some bad in every way a real feed is bad, processes them with
    the Spark pipeline (a Spark SQL transform; with --map, a per-row Python function; with
    --engine, a plain-Python Processor without Spark), and checks that each one was written
    once or dead-lettered with the right reason."""
    if engine and per_row:
        raise click.UsageError("--engine runs no Spark pipeline: give --engine or --map")
    if engine:
        run_demo(directory=directory, orders=ENGINE_DEMO_ORDERS if orders is None else orders)
        return
    require_pyspark()
    from poisonq.spark.demo import main as run_spark_demo  # needs PySpark: only imported here

    run_spark_demo(
        directory=directory,
        orders=SPARK_DEMO_ORDERS if orders is None else orders,
        map=per_row,
        without_job_failing=without_job_failing,
    )
