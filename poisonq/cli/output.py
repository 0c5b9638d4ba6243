"""Rendering: ``--json`` or rich tables on stdout, progress bars on stderr, messages shown.

Progress is shown only on a terminal, so pipes and ``--json`` stay clean. Message bodies and
error texts are untrusted: they are rendered as plain :class:`~rich.text.Text`, never parsed
as rich markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from poisonq.cli.app import App
from poisonq.jsonview import message_json
from poisonq.model import FailureRecord, ReceivedMessage

BODY_PREVIEW = 60
SHORT_VALUE = 24

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON to stdout instead of a table."
)


def emit(app: App, as_json: bool, data: Any, render: Callable[[], RenderableType]) -> None:
    """Print ``data`` as JSON, or what ``render`` builds for a human."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        app.out.print(render())


Update = Callable[[float, float | None, str], None]


@contextmanager
def progress(app: App, description: str, *, quiet: bool = False) -> Iterator[Update]:
    """A progress bar on stderr, shown only on a terminal (and not ``quiet``) so that pipes
    stay clean. Yields ``update(completed, total, note)``; the total may be unknown (None)
    and the units are the caller's (bytes of a file, messages of a task), so ``note`` says
    what was done."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=app.err, disable=quiet or not app.err.is_terminal) as bar:
        task = bar.add_task(description, total=None, note="")

        def update(completed: float, total: float | None, note: str) -> None:
            bar.update(task, completed=completed, total=total, note=note)

        yield update


def short_time(value: datetime | float | None) -> str:
    """A short local time for tables: the time of day for today, else date and minute (as
    ``ls -l`` does), so that tables fit a terminal; JSON has the exact time."""
    if value is None:
        return ""
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    local = value.astimezone()
    today = local.date() == datetime.now().astimezone().date()
    return local.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A table whose cells are plain text (never markup: cells hold untrusted data). Columns
    of short values (counts, times, fingerprints, reasons: what an operator copies into the
    next command) are never cut; only long text (bodies, errors) gives way on a narrow
    terminal, and headers wrap between words. A :class:`Text` cell is shown as it is styled
    (a bar)."""
    cells = [[_cell(cell) for cell in row] for row in rows]
    shown = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for index, column in enumerate(columns):
        words = max(len(word) for word in column.split())
        width = max([words, *(row[index].cell_len for row in cells)])
        if width <= SHORT_VALUE:
            shown.add_column(column, min_width=width)
        else:
            shown.add_column(column, overflow="fold")
    for row in cells:
        shown.add_row(*row)
    return shown


def _cell(value: Any) -> Text:
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


# Messages ---------------------------------------------------------------------------------
def _preview(message: ReceivedMessage) -> str:
    text = " ".join(message.text.split())
    return text if len(text) <= BODY_PREVIEW else text[: BODY_PREVIEW - 1] + "…"


def messages_table(title: str, messages: list[ReceivedMessage]) -> Table:
    dead = any(m.dead_letter_reason for m in messages)
    columns = ["seq", "message id", "subject", "deliveries", *(["reason"] if dead else []), "body"]
    rows = [
        [m.sequence_number, m.message_id, m.subject, m.delivery_count]
        + ([m.dead_letter_reason] if dead else [])
        + [_preview(m)]
        for m in messages
    ]
    return table(f"{title} ({len(messages)})", columns, rows)


def _failure_panel(number: int, failure: FailureRecord) -> Panel:
    title = f"failure {number}: {failure.error_type} at {short_time(failure.time)}"
    text = Text(f"{failure.message}\nfingerprint {failure.fingerprint}\n\n")
    text.append(failure.traceback or "(no traceback)", style="dim")
    return Panel(text, title=Text(title), title_align="left")


def message_detail(message: ReceivedMessage) -> RenderableType:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    for name, value in message_json(message).items():
        if name not in ("body", "failures"):
            shown = json.dumps(value) if isinstance(value, dict) else value
            fields.add_row(name, Text("" if shown is None else str(shown)))
    parts: list[RenderableType] = [fields, Panel(Text(message.text), title="body")]
    parts += [_failure_panel(n, f) for n, f in enumerate(message.failures, 1)]
    return Group(*parts)
