"""``poisonq task list|show|cancel``: the resubmits and purges, whoever ran them.

The task list is the operators' audit trail: every process records its tasks in the store,
with who started and who cancelled each (the name given at the web UI's login, or
``POISONQ_OPERATOR``, else the user and host of the command line).
"""

from __future__ import annotations

import click
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.output import emit, json_option, short_time, table
from poisonq.client import TaskRecord
from poisonq.jsonview import task_json
from poisonq.names import parse_address


@click.group()
def task() -> None:
    """List, show and cancel resubmit and purge tasks."""


def _selection(record: TaskRecord) -> str:
    chosen = [f"{k}={v}" for k, v in record.spec.get("where", {}).items() if v is not None]
    rate, to = record.spec.get("rate"), record.spec.get("to")
    paced = f" at {rate:g}/s" if rate else ""
    return " ".join(chosen or ["every dead letter"]) + paced + (f" to {to}" if to else "")


def _row(record: TaskRecord) -> list[object]:
    status = record.status + (f" by {record.cancelled_by}" if record.cancelled_by else "")
    return [
        record.id,
        record.kind,
        parse_address(record.entity).entity,
        status,
        f"{record.done} of {record.total}",
        record.started_by or "",
        short_time(record.created_at),
        _selection(record),
    ]


COLUMNS = ["task", "kind", "queue", "status", "done", "started by", "started", "selection"]


@task.command("list")
@click.option(
    "--queue", "queue_name", metavar="QUEUE", help="Only the tasks on QUEUE's dead letters."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many."
)
@click.option("--before", type=click.IntRange(min=1), help="Only tasks older than this task id.")
@json_option
@click.pass_obj
def task_list(
    app: App, /, queue_name: str | None, limit: int, before: int | None, as_json: bool
) -> None:
    """The newest tasks first: who started each, what it selected, how far it got."""
    records = app.broker.tasks(queue_name, before=before, limit=limit)
    emit(
        app,
        as_json,
        [task_json(r) for r in records],
        lambda: table("tasks", COLUMNS, [_row(r) for r in records]),
    )


@task.command("show")
@click.argument("task_id", metavar="ID", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def task_show(app: App, /, task_id: int, as_json: bool) -> None:
    """One task."""
    record = app.broker.task(task_id)
    emit(app, as_json, task_json(record), lambda: table(f"task {task_id}", COLUMNS, [_row(record)]))


@task.command("cancel")
@click.argument("task_id", metavar="ID", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def task_cancel(app: App, /, task_id: int, as_json: bool) -> None:
    """Cancel a running task: the process running it stops after its current chunk, and
    what was moved stays moved. A task whose process died stays marked running until
    cancelled (or a minute without progress lets another task start on its queue)."""
    running = app.broker.task(task_id).status == "running"
    record = app.broker.cancel_task(task_id, by=app.operator)
    summary = task_summary(record) if running else f"{task_summary(record)}: nothing to cancel"
    emit(app, as_json, task_json(record), lambda: Text(summary))


def task_summary(record: TaskRecord) -> str:
    """One line of what a task came to, and who cancelled it if someone did."""
    by = f" by {record.cancelled_by}" if record.cancelled_by else ""
    done = f"{record.done} of {record.total} message(s)"
    return f"{record.kind} task {record.id} {record.status}{by}: {done}"
