"""``poisonq dlq list|show|resubmit|purge``: what an operator on call does with poison.

Resubmit and purge run as tracked bulk tasks with a progress bar; Ctrl-C cancels a resubmit
and keeps what was already moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.filters import dlq_filters, filter_arguments
from poisonq.cli.output import (
    emit,
    json_option,
    message_detail,
    progress,
    short_time,
    table,
)
from poisonq.cli.tasks import task_summary
from poisonq.client import DeadLetterGroup, group_label, grouping_for
from poisonq.jsonview import group_json, message_json, task_json
from poisonq.model import SubQueue
from poisonq.names import parse_address
from poisonq.tasks import BulkTask

TaskStart = Callable[[Callable[[BulkTask], None]], BulkTask]


def _run_task(app: App, description: str, start: TaskStart, as_json: bool) -> None:
    """Run a bulk task with a progress bar, then print what it did. ``start`` gets the
    progress callback. Ctrl-C cancels a task running in the background (a resubmit), so its
    record does not stay "running"; what was already moved stays moved."""
    with progress(app, description) as update:
        task = start(lambda t: update(t.done, t.total, f"{t.done}/{t.total}"))
        try:
            task.wait()
        except KeyboardInterrupt:
            task.cancel(by=app.operator)
            task.wait()
    if task.error is not None:
        raise task.error
    record = task.record
    emit(app, as_json, task_json(record), lambda: Text(task_summary(record)))


@click.group()
def dlq() -> None:
    """Inspect, resubmit and purge a dead-letter queue."""


def _span(group: DeadLetterGroup) -> tuple[str, str]:
    return short_time(group.first_seen), short_time(group.last_seen)


def _groups_table(queue: str, by: str, groups: list[DeadLetterGroup]) -> Table:
    """Groups by reason or subject; by fingerprint with the error type beside it (a message
    that never failed, such as an expired one, has no fingerprint: ``(none)``)."""
    typed = by == "fingerprint"
    columns = [by, *(["error type"] if typed else []), "count", "first", "last"]
    rows = [[group_label(g.key), *([g.label] if typed else []), g.count, *_span(g)] for g in groups]
    return table(f"dead-lettered in {queue} by {by}", columns, rows)


@dlq.command("list")
@click.argument("queue_name", metavar="QUEUE")
@click.option(
    "--by",
    type=click.Choice(["reason", "subject", "fingerprint"]),
    default="reason",
    show_default=True,
    help="Group key; fingerprint groups alike failures (root-cause type and where raised).",
)
@json_option
@click.pass_obj
def dlq_list(app: App, /, queue_name: str, by: str, as_json: bool) -> None:
    """Count dead-lettered messages in groups.

    Groups the dead-lettered messages of QUEUE by reason, subject or fingerprint, largest
    group first.
    """
    groups = app.broker.dead_letter_groups(queue_name, by)
    data = [group_json(g) for g in groups]
    emit(app, as_json, data, lambda: _groups_table(queue_name, by, groups))


@dlq.command("show")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("sequence_number", metavar="SEQ", type=int)
@json_option
@click.pass_obj
def dlq_show(app: App, /, queue_name: str, sequence_number: int, as_json: bool) -> None:
    """Show one dead-lettered message.

    Shows message SEQ of QUEUE's dead-letter queue with every field and its failure history.
    """
    address = str(parse_address(queue_name, SubQueue.DEADLETTER))
    message = app.broker.message(address, sequence_number)
    emit(app, as_json, message_json(message), lambda: message_detail(message))


def _given(filters: dict[str, Any]) -> str:
    """``k=v, ...`` for the filters given (empty for none)."""
    return ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None)


def _matching(
    app: App, action: str, queue: str, filters: dict[str, Any], where: dict[str, Any]
) -> int:
    """How many dead letters of ``queue`` the filters select. When none, the command stops
    with exit code 1 and shows what is there instead, grouped by the field filtered on
    (the reason by default), so the next try can be right."""
    count = app.broker.count_dead_letters(queue, **where)
    if count:
        return count
    by = grouping_for(where)
    groups = app.broker.dead_letter_groups(queue, by)
    if groups:
        why = f"no dead letter of {queue!r} matches {_given(filters)}; they are, by {by}:"
    else:
        why = f"the dead-letter queue of {queue!r} is empty"
    app.err.print(Text(f"nothing to {action}: {why}", style="red"), soft_wrap=True)
    if groups:
        app.err.print(_groups_table(queue, by, groups))
    app.ctx.exit(1)


@dlq.command("resubmit")
@click.argument("queue_name", metavar="QUEUE")
@dlq_filters
@click.option("--to", help="Send them to this queue instead of QUEUE.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0),
    default=500.0,
    show_default=True,
    help="Messages per second; 0: no limit.",
)
@json_option
@click.pass_obj
def dlq_resubmit(
    app: App, /, queue_name: str, to: str | None, rate: float, as_json: bool, **filters: Any
) -> None:
    """Send dead-lettered messages back.

    Moves the dead-lettered messages of QUEUE that match the filters back to it (or --to)
    with a fresh delivery count, at most --rate per second; their failure history is kept.
    Ctrl-C cancels the task; what was moved stays moved. When nothing matches, it shows the
    dead letters there are and exits with 1.
    """
    where = filter_arguments(filters)
    _matching(app, "resubmit", queue_name, filters, where)
    _run_task(
        app,
        f"resubmitting from {queue_name}",
        lambda progress: app.broker.resubmit(
            queue_name,
            to=to,
            rate=rate or None,
            wait=False,
            progress=progress,
            started_by=app.operator,
            **where,
        ),
        as_json,
    )


@dlq.command("purge")
@click.argument("queue_name", metavar="QUEUE")
@dlq_filters
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_obj
def dlq_purge(app: App, /, queue_name: str, yes: bool, as_json: bool, **filters: Any) -> None:
    """Drop dead-lettered messages.

    Drops the dead-lettered messages of QUEUE that match the filters (all by default).
    When nothing matches, it shows the dead letters there are and exits with 1.
    """
    where = filter_arguments(filters)
    count = _matching(app, "purge", queue_name, filters, where)
    if not yes:
        given = _given(filters)
        matching = f" matching {given}" if given else ""
        question = f"Drop {count} dead-lettered message(s) of {queue_name!r}{matching}?"
        click.confirm(question, abort=True, err=True)
    _run_task(
        app,
        f"purging {queue_name}",
        lambda progress: app.broker.purge(
            queue_name, progress=progress, started_by=app.operator, **where
        ),
        as_json,
    )
