"""The ``poisonq`` command line: admin, send/receive/peek, the dead-letter queue, audit, demo.

Human output is rich tables on stdout and progress bars on stderr (only on a terminal, so
pipes and ``--json`` stay clean). Every listing takes ``--json``. A :class:`PoisonqError` is
the user's problem, not a bug, so it is printed as one red ``error:`` line with exit code 2
instead of a traceback. Message bodies and error texts are untrusted: they are rendered as
plain :class:`~rich.text.Text`, never parsed as rich markup.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import click
from rich import box
from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from poisonq.client import DEFAULT_URL, Broker, connect
from poisonq.demo import main as run_demo
from poisonq.errors import InvalidOptionError, PoisonqError
from poisonq.model import (
    FailureRecord,
    Message,
    PropertyValue,
    ReceivedMessage,
    ReceiveMode,
    SubQueue,
)
from poisonq.names import parse_address
from poisonq.options import QueueOptions
from poisonq.reports import AuditReport, QueueInfo
from poisonq.store.base import DeadLetterGroup
from poisonq.tasks import BulkTask

F = TypeVar("F", bound=Callable[..., Any])

SEND_BATCH = 500
NEVER = "never"
BODY_PREVIEW = 60
SHORT_VALUE = 24
TEXT_FIELDS = ("message_id", "subject", "content_type", "correlation_id", "reply_to", "session_id")
LINE_FIELDS = ("body", *TEXT_FIELDS, "properties", "time_to_live")


class PartialSendError(PoisonqError):
    """A send from the command line stopped part way: earlier batches were sent (each batch
    is all or nothing), the failing batch and everything after it were not."""


# Plumbing ---------------------------------------------------------------------------------
@dataclasses.dataclass
class App:
    """What every command needs: the store URL, the consoles and a broker opened on demand
    (so ``--help`` and usage errors never touch the store)."""

    url: str
    ctx: click.Context
    out: Console = dataclasses.field(default_factory=Console)
    err: Console = dataclasses.field(default_factory=lambda: Console(stderr=True))
    _broker: Broker | None = dataclasses.field(default=None, init=False)

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = self.ctx.with_resource(connect(self.url))
        return self._broker


class _Cli(click.Group):
    """The root group: turns a :class:`PoisonqError` from any command into one red line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PoisonqError as exc:
            line = " ".join(str(exc).split())
            Console(stderr=True).print(Text(f"error: {line}", style="red"), soft_wrap=True)
            ctx.exit(2)


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON to stdout instead of a table."
)


def _emit(app: App, as_json: bool, data: Any, render: Callable[[], RenderableType]) -> None:
    """Print ``data`` as JSON, or what ``render`` builds for a human."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        app.out.print(render())


def _apply(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """One decorator from several click options, so option sets are declared once."""

    def decorate(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


Update = Callable[[float, float | None, str], None]


@contextmanager
def _progress(app: App, description: str) -> Iterator[Update]:
    """A progress bar on stderr, shown only on a terminal so that pipes stay clean. Yields
    ``update(completed, total, note)``; the total may be unknown (None) and the units are the
    caller's (bytes of a file, messages of a task), so ``note`` says what was done."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=app.err, disable=not app.err.is_terminal) as bar:
        task = bar.add_task(description, total=None, note="")

        def update(completed: float, total: float | None, note: str) -> None:
            bar.update(task, completed=completed, total=total, note=note)

        yield update


def _time(value: datetime | float | None) -> str | None:
    """ISO 8601 in UTC for JSON (a float is seconds since the epoch)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.isoformat()


def _local(value: datetime | float | None) -> str:
    """A short local time for tables: the time of day for today, else date and minute (as
    ``ls -l`` does), so that tables fit a terminal; JSON has the exact time."""
    if value is None:
        return ""
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    local = value.astimezone()
    today = local.date() == datetime.now().astimezone().date()
    return local.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")


def _table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A table whose cells are plain text (never markup: cells hold untrusted data). Columns
    of short values (counts, times, fingerprints, reasons: what an operator copies into the
    next command) are never cut; only long text (bodies, errors) gives way on a narrow
    terminal, and headers wrap between words."""
    cells = [[Text("" if cell is None else str(cell)) for cell in row] for row in rows]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for index, column in enumerate(columns):
        words = max(len(word) for word in column.split())
        width = max([words, *(row[index].cell_len for row in cells)])
        if width <= SHORT_VALUE:
            table.add_column(column, min_width=width)
        else:
            table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*row)
    return table


# Messages ---------------------------------------------------------------------------------
def _body_json(body: bytes) -> dict[str, str]:
    """A body as UTF-8 text, or base64 when it is not text."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "body_encoding": "base64"}


def _message_json(message: ReceivedMessage) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        data[field.name] = _time(value) if isinstance(value, datetime) else value
    data.update(_body_json(message.body))
    data["failures"] = [
        {**failure.to_json(), "time": _time(failure.time)} for failure in message.failures
    ]
    return data


def _preview(message: ReceivedMessage) -> str:
    text = " ".join(message.text.split())
    return text if len(text) <= BODY_PREVIEW else text[: BODY_PREVIEW - 1] + "…"


def _messages_table(title: str, messages: list[ReceivedMessage]) -> Table:
    dead = any(m.dead_letter_reason for m in messages)
    columns = ["seq", "message id", "subject", "deliveries", *(["reason"] if dead else []), "body"]
    rows = [
        [m.sequence_number, m.message_id, m.subject, m.delivery_count]
        + ([m.dead_letter_reason] if dead else [])
        + [_preview(m)]
        for m in messages
    ]
    return _table(f"{title} ({len(messages)})", columns, rows)


def _failure_panel(number: int, failure: FailureRecord) -> Panel:
    title = f"failure {number}: {failure.error_type} at {_local(failure.time)}"
    text = Text(f"{failure.message}\nfingerprint {failure.fingerprint}\n\n")
    text.append(failure.traceback or "(no traceback)", style="dim")
    return Panel(text, title=Text(title), title_align="left")


def _message_detail(message: ReceivedMessage) -> RenderableType:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    for name, value in _message_json(message).items():
        if name not in ("body", "failures"):
            shown = json.dumps(value) if isinstance(value, dict) else value
            fields.add_row(name, Text("" if shown is None else str(shown)))
    parts: list[RenderableType] = [fields, Panel(Text(message.text), title="body")]
    parts += [_failure_panel(n, f) for n, f in enumerate(message.failures, 1)]
    return Group(*parts)


# Queues -----------------------------------------------------------------------------------
def _seconds_or_never(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """Seconds, or ``never`` (kept as the marker :data:`NEVER`: None means "not given")."""
    if value is None or value.lower() == NEVER:
        return value and NEVER
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither seconds nor 'never'") from None


DEFAULTS = QueueOptions()
_QUEUE_OPTIONS = (
    click.option(
        "--max-delivery-count",
        type=click.IntRange(min=1),
        help=f"Deliveries before dead-lettering [default: {DEFAULTS.max_delivery_count}].",
    ),
    click.option(
        "--lock-duration",
        type=float,
        help=f"Seconds a peek-lock lasts (max 300) [default: {DEFAULTS.lock_duration:g}].",
    ),
    click.option(
        "--default-message-ttl",
        metavar="SECONDS|never",
        callback=_seconds_or_never,
        help="Seconds a message lives, or 'never' [default: never].",
    ),
    click.option(
        "--dead-lettering-on-message-expiration/--no-dead-lettering-on-message-expiration",
        default=None,
        help="Dead-letter expired messages instead of dropping them [default: on].",
    ),
    click.option(
        "--requires-duplicate-detection/--no-requires-duplicate-detection",
        default=None,
        help="Ignore a message_id seen within the window [default: off].",
    ),
    click.option(
        "--duplicate-detection-window",
        type=float,
        help="Seconds a message_id is remembered (20 s to 7 days) "
        f"[default: {DEFAULTS.duplicate_detection_window:g}].",
    ),
    click.option(
        "--max-message-size",
        type=int,
        help=f"Largest message in bytes [default: {DEFAULTS.max_message_size}].",
    ),
    click.option(
        "--max-properties-size",
        type=int,
        help="Largest properties in bytes; larger ones are dead-lettered "
        f"[default: {DEFAULTS.max_properties_size}].",
    ),
    click.option(
        "--max-size", type=int, help=f"Largest queue in bytes [default: {DEFAULTS.max_size}]."
    ),
    click.option(
        "--auto-disable-after-rollbacks",
        type=int,
        help="Disable receiving after N abandons in a row with no completion [default: off].",
    ),
)
queue_options = _apply(_QUEUE_OPTIONS)


def _queue_changes(options: dict[str, Any]) -> dict[str, Any]:
    """The queue options given on the command line (``never`` meaning none)."""
    return {k: (None if v == NEVER else v) for k, v in options.items() if v is not None}


def _queue_json(info: QueueInfo) -> dict[str, Any]:
    options = info.options.to_json()
    options["max_delivery_count"] = info.options.max_delivery_count
    return {
        "name": info.name,
        "subqueue": info.subqueue,
        "status": info.status,
        "status_cause": info.status_cause,
        "options": options,
        "counts": info.counts,
        "ledger": dataclasses.asdict(info.ledger),
        "created_at": _time(info.created_at),
        "updated_at": _time(info.updated_at),
    }


def _queue_detail(info: QueueInfo) -> RenderableType:
    """The queue's status and options (the retry policy flattened) beside its counts."""
    data = _queue_json(info)
    options = data.pop("options")
    retry = {f"retry.{k}": v for k, v in options.pop("retry").items()}
    plain = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    rows = [*plain, *options.items(), *retry.items()]
    about = _table(f"queue {info.name}", ["property", "value"], rows)
    counts = _table("messages", ["state", "count"], info.counts.items())
    return Columns([about, counts])


def _show_queue(app: App, info: QueueInfo, as_json: bool) -> None:
    _emit(app, as_json, _queue_json(info), lambda: _queue_detail(info))


COUNT_COLUMNS = ("active", "scheduled", "locked", "deferred", "dead_lettered", "completed")


def _queues_table(queues: list[QueueInfo]) -> Table:
    rows = [[q.name, q.status, *(q.counts[c] for c in COUNT_COLUMNS)] for q in queues]
    headers = [c.replace("_", " ") for c in COUNT_COLUMNS]
    return _table("queues", ["name", "status", *headers], rows)


# The command tree -------------------------------------------------------------------------
@click.group(cls=_Cli)
@click.option(
    "--url",
    envvar="POISONQ_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Store URL: sqlite:///path.db (also from POISONQ_URL).",
)
@click.version_option(package_name="poisonq")
@click.pass_context
def cli(ctx: click.Context, url: str) -> None:
    """poisonq: a durable message queue with poison-message handling.

    \b
    Examples:
      poisonq queue create orders --max-delivery-count 5
      poisonq send orders '{"id": 1}' --subject order --property region=eu
      poisonq send orders --file orders.jsonl
      poisonq receive orders --max 10
      poisonq dlq list orders --by fingerprint
      poisonq dlq show orders 42
      poisonq dlq resubmit orders --reason MaxDeliveryCountExceeded --rate 200
      poisonq audit
    """
    ctx.obj = App(url, ctx)


@cli.group()
def queue() -> None:
    """Create, inspect, change and delete queues."""


@queue.command("create")
@click.argument("name")
@queue_options
@json_option
@click.pass_obj
def queue_create(app: App, /, name: str, as_json: bool, **options: Any) -> None:
    """Create a queue.

    Creates NAME with its dead-letter queue; options not given keep their defaults.
    """
    _show_queue(app, app.broker.create_queue(name, **_queue_changes(options)), as_json)


@queue.command("list")
@json_option
@click.pass_obj
def queue_list(app: App, /, as_json: bool) -> None:
    """List queues with their status and message counts."""
    queues = app.broker.list_queues()
    _emit(app, as_json, [_queue_json(q) for q in queues], lambda: _queues_table(queues))


@queue.command("show")
@click.argument("name")
@json_option
@click.pass_obj
def queue_show(app: App, /, name: str, as_json: bool) -> None:
    """Show a queue's options and counts.

    NAME may be a queue or a subqueue address such as 'orders/$deadletterqueue'.
    """
    _show_queue(app, app.broker.get_queue(name), as_json)


@queue.command("update")
@click.argument("name")
@queue_options
@json_option
@click.pass_obj
def queue_update(app: App, /, name: str, as_json: bool, **options: Any) -> None:
    """Change a queue's options.

    Options not given keep their values.
    """
    changes = _queue_changes(options)
    if not changes:
        raise click.UsageError("give at least one option to change (see --help)")
    _show_queue(app, app.broker.update_queue(name, **changes), as_json)


@queue.command("enable")
@click.argument("name")
@click.pass_obj
def queue_enable(app: App, /, name: str) -> None:
    """Let a queue send and receive again.

    Also after a fault or an auto-disable.
    """
    app.broker.enable(name)
    app.out.print(Text(f"{name} is active"))


@queue.command("disable")
@click.argument("name")
@click.pass_obj
def queue_disable(app: App, /, name: str) -> None:
    """Refuse sends and receives on a queue.

    Its messages stay.
    """
    app.broker.disable(name)
    app.out.print(Text(f"{name} is disabled"))


@queue.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def queue_delete(app: App, /, name: str, yes: bool) -> None:
    """Delete a queue.

    Deletes NAME with its subqueues and every message they hold.
    """
    if not yes:
        click.confirm(f"Delete queue {name!r} and all its messages?", abort=True, err=True)
    app.broker.delete_queue(name)
    app.out.print(Text(f"deleted queue {name}"))


# Sending ----------------------------------------------------------------------------------
def _property(text: str) -> tuple[str, PropertyValue]:
    """``k=v``: a JSON number, true, false or null is typed; anything else is a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not KEY=VALUE", param_hint="--property")
    try:
        value = json.loads(raw)
    except ValueError:
        return key, raw
    return key, value if isinstance(value, int | float | bool) or value is None else raw


def _check_line(data: Any) -> str | None:
    """Why a parsed JSON line is not a message, or None if it is one."""
    if not isinstance(data, dict) or "body" not in data:
        return 'expected a JSON object with a "body"'
    unknown = sorted(set(data) - set(LINE_FIELDS))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}; use {', '.join(LINE_FIELDS)}"
    for name in TEXT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            return f'"{name}" must be a string'
    properties = data.get("properties") or {}
    if not isinstance(properties, dict) or any(
        isinstance(v, dict | list) for v in properties.values()
    ):
        return '"properties" must be an object of strings, numbers, booleans or nulls'
    ttl = data.get("time_to_live")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
        return '"time_to_live" must be a number of seconds > 0'
    return None


def _line_message(number: int, line: bytes, defaults: dict[str, Any]) -> Message:
    """The message on JSON line ``number``; a body that is not a string is JSON-encoded."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise InvalidOptionError(f"line {number}: not valid JSON ({exc})") from None
    problem = _check_line(data)
    if problem is not None:
        raise InvalidOptionError(f"line {number}: {problem}")
    body = data.pop("body")
    given = {k: v for k, v in data.items() if v is not None}
    properties = {**defaults["properties"], **given.pop("properties", {})}
    return Message(
        body=body if isinstance(body, str) else json.dumps(body),
        **{**defaults, **given, "properties": properties},
    )


def _line_batches(
    stream: IO[bytes], defaults: dict[str, Any], size: int
) -> Iterator[tuple[list[Message], int]]:
    """Batches of messages read from JSON lines, each with the bytes it consumed. A bad line
    raises before its batch is yielded, so nothing of that batch is sent."""
    batch: list[Message] = []
    consumed = 0
    for number, line in enumerate(stream, 1):
        consumed += len(line)
        if line.strip():
            batch.append(_line_message(number, line, defaults))
        if len(batch) >= size:
            yield batch, consumed
            batch, consumed = [], 0
    if batch or consumed:
        yield batch, consumed


def _size(stream: IO[bytes]) -> int | None:
    """The size of a regular file, for the progress bar (None for pipes and terminals)."""
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _send_all(
    app: App, address: str, batches: Iterable[tuple[list[Message], int]], total: int | None
) -> list[int]:
    """Send batch after batch (each one transaction) with a progress bar in the batches'
    units out of ``total``."""
    sender = app.broker.sender(address)
    sent: list[int] = []
    done = 0
    with _progress(app, f"sending to {address}") as update:
        try:
            for batch, units in batches:
                if batch:
                    sent += sender.send(batch)
                done += units
                update(done, total, f"{len(sent)} sent")
        except PoisonqError as exc:
            if not sent:
                raise
            raise PartialSendError(
                f"{exc}; {len(sent)} message(s) of earlier batches were sent, none after"
            ) from exc
    return sent


@cli.command()
@click.argument("address")
@click.argument("bodies", metavar="[BODY]...", nargs=-1)
@click.option(
    "--file",
    "source",
    type=click.File("rb"),
    metavar="PATH",
    help="Send the JSON lines of PATH ('-': stdin).",
)
@click.option("--subject", help="Message subject (type).")
@click.option("--message-id", help="Message id (one BODY only); default: a new UUID.")
@click.option("--content-type", help="Content type, e.g. application/json.")
@click.option(
    "--property", "properties", multiple=True, metavar="KEY=VALUE", help="A property (repeatable)."
)
@click.option("--ttl", type=click.FloatRange(min=0, min_open=True), help="Time to live in seconds.")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 5000),
    default=SEND_BATCH,
    show_default=True,
    help="Messages per transaction.",
)
@json_option
@click.pass_obj
def send(
    app: App,
    /,
    address: str,
    bodies: tuple[str, ...],
    source: IO[bytes] | None,
    subject: str | None,
    message_id: str | None,
    content_type: str | None,
    properties: tuple[str, ...],
    ttl: float | None,
    batch_size: int,
    as_json: bool,
) -> None:
    """Send messages.

    Sends each BODY as a message to ADDRESS, or the JSON lines of --file.

    \b
    A line is {"body": <string or JSON value>, "subject": ..., "message_id": ...,
    "properties": {...}, "time_to_live": ...}; a body that is not a string is sent as JSON.
    The options apply to every message; a line's own fields win. Lines are sent in batches,
    each all or nothing: a bad line stops the send before its batch.
    """
    if bool(bodies) == (source is not None):
        raise click.UsageError("give BODY arguments or --file, not both or neither")
    if message_id is not None and len(bodies) != 1:
        raise click.UsageError("--message-id needs exactly one BODY")
    defaults: dict[str, Any] = {"properties": dict(map(_property, properties))}
    for name, value in (
        ("subject", subject),
        ("content_type", content_type),
        ("time_to_live", ttl),
    ):
        if value is not None:
            defaults[name] = value
    if source is None:
        messages = [Message(body=body, **defaults) for body in bodies]
        if message_id is not None:
            messages[0].message_id = message_id
        chunks = [messages[i : i + batch_size] for i in range(0, len(messages), batch_size)]
        sent = _send_all(app, address, ((c, len(c)) for c in chunks), len(messages))
    else:
        sent = _send_all(app, address, _line_batches(source, defaults, batch_size), _size(source))
    data = {"address": address, "sent": len(sent), "sequence_numbers": sent}
    _emit(app, as_json, data, lambda: Text(f"sent {len(sent)} message(s) to {address}"))


# Receiving --------------------------------------------------------------------------------
SETTLE_CHOICES = ("complete", "abandon", "defer", "none")


@cli.command()
@click.argument("address")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Most messages to receive.",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the first message.",
)
@click.option(
    "--mode",
    type=click.Choice(["peek-lock", "receive-and-delete"]),
    default="peek-lock",
    show_default=True,
    help="receive-and-delete is at-most-once: the message is gone as it is handed out.",
)
@click.option(
    "--settle",
    type=click.Choice(SETTLE_CHOICES),
    help="What to do with peek-locked messages [default: complete]; 'none' keeps the lock.",
)
@json_option
@click.pass_obj
def receive(
    app: App,
    /,
    address: str,
    max_messages: int,
    wait: float,
    mode: str,
    settle: str | None,
    as_json: bool,
) -> None:
    """Receive messages and settle them.

    Receives up to --max messages from ADDRESS and completes them (so a receive consumes
    them) unless --settle says otherwise.
    """
    receive_mode = ReceiveMode(mode.replace("-", "_"))
    if receive_mode is ReceiveMode.RECEIVE_AND_DELETE and settle not in (None, "none"):
        raise click.UsageError("messages received with receive-and-delete cannot be settled")
    receiver = app.broker.receiver(address, receive_mode=receive_mode)
    messages = receiver.receive(max_messages=max_messages, max_wait=wait)
    if messages and receive_mode is ReceiveMode.PEEK_LOCK:
        match settle or "complete":
            case "complete":
                receiver.complete(messages)
            case "abandon":
                receiver.abandon(messages)
            case "defer":
                receiver.defer(messages)
    data = [_message_json(m) for m in messages]
    _emit(app, as_json, data, lambda: _messages_table(f"received from {address}", messages))


@cli.command()
@click.argument("address")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Most messages to show.",
)
@click.option(
    "--from-sequence",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Start at this sequence number (page on from the last one shown + 1).",
)
@json_option
@click.pass_obj
def peek(app: App, /, address: str, max_messages: int, from_sequence: int, as_json: bool) -> None:
    """Look at messages without receiving them.

    Shows the messages of ADDRESS (a queue or a subqueue such as 'orders/$deadletterqueue')
    without locking them or counting a delivery.
    """
    messages = app.broker.peek(address, from_sequence=from_sequence, max_messages=max_messages)
    data = [_message_json(m) for m in messages]
    _emit(app, as_json, data, lambda: _messages_table(f"messages in {address}", messages))


# The dead-letter queue --------------------------------------------------------------------
def _timestamp(value: datetime | None) -> float | None:
    """Seconds since the epoch; a time given without a zone is local time."""
    return None if value is None else value.astimezone().timestamp()


_FILTER_OPTIONS = (
    click.option("--reason", help="Only messages dead-lettered with this reason."),
    click.option("--subject", help="Only messages with this subject."),
    click.option("--fingerprint", help="Only messages whose last failure has this fingerprint."),
    click.option("--min-sequence", type=int, help="Only sequence numbers >= N."),
    click.option("--max-sequence", type=int, help="Only sequence numbers <= N."),
    click.option(
        "--since",
        type=click.DateTime(),
        metavar="TIME",
        help="Only dead-lettered at or after TIME (local, YYYY-MM-DD[ HH:MM:SS]).",
    ),
    click.option(
        "--until",
        type=click.DateTime(),
        metavar="TIME",
        help="Only dead-lettered before TIME (local, YYYY-MM-DD[ HH:MM:SS]).",
    ),
)
dlq_filters = _apply(_FILTER_OPTIONS)


def _filters(given: dict[str, Any]) -> dict[str, Any]:
    """Filter keyword arguments for Broker.resubmit/purge from the options given."""
    where = {k: v for k, v in given.items() if v is not None}
    for name in ("since", "until"):
        if name in where:
            where[name] = _timestamp(where[name])
    return where


def _task_json(task: BulkTask) -> dict[str, Any]:
    record = task.record
    times = {"created_at": _time(record.created_at), "updated_at": _time(record.updated_at)}
    return {**dataclasses.asdict(record), **times}


TaskStart = Callable[[Callable[[BulkTask], None]], BulkTask]


def _run_task(app: App, description: str, start: TaskStart, as_json: bool) -> None:
    """Run a bulk task with a progress bar, then print what it did. ``start`` gets the
    progress callback. Ctrl-C cancels a task running in the background (a resubmit), so its
    record does not stay "running"; what was already moved stays moved."""
    with _progress(app, description) as update:
        task = start(lambda t: update(t.done, t.total, f"{t.done}/{t.total}"))
        try:
            task.wait()
        except KeyboardInterrupt:
            task.cancel()
            task.wait()
    if task.error is not None:
        raise task.error
    record = task.record
    summary = f"{record.kind} task {record.id} {record.status}: {record.done} of {record.total}"
    _emit(app, as_json, _task_json(task), lambda: Text(f"{summary} message(s)"))


@cli.group()
def dlq() -> None:
    """Inspect, resubmit and purge a dead-letter queue."""


def _span(group: DeadLetterGroup) -> tuple[str, str]:
    return _local(group.first_seen), _local(group.last_seen)


def _groups_table(queue: str, by: str, groups: list[DeadLetterGroup]) -> Table:
    """Groups by reason or subject; by fingerprint with the error type beside it (a message
    that never failed, such as an expired one, has no fingerprint: ``(none)``)."""
    typed = by == "fingerprint"
    columns = [by, *(["error type"] if typed else []), "count", "first", "last"]
    rows = [[g.key or "(none)", *([g.label] if typed else []), g.count, *_span(g)] for g in groups]
    return _table(f"dead-lettered in {queue} by {by}", columns, rows)


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
    data = [
        {
            **dataclasses.asdict(g),
            "first_seen": _time(g.first_seen),
            "last_seen": _time(g.last_seen),
        }
        for g in groups
    ]
    _emit(app, as_json, data, lambda: _groups_table(queue_name, by, groups))


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
    _emit(app, as_json, _message_json(message), lambda: _message_detail(message))


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
    Ctrl-C cancels the task; what was moved stays moved.
    """
    where = _filters(filters)
    _run_task(
        app,
        f"resubmitting from {queue_name}",
        lambda progress: app.broker.resubmit(
            queue_name, to=to, rate=rate or None, wait=False, progress=progress, **where
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
    """
    where = _filters(filters)
    if not yes:
        given = ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None)
        matching = f" matching {given}" if given else ""
        question = f"Drop the dead-lettered messages of {queue_name!r}{matching}?"
        click.confirm(question, abort=True, err=True)
    _run_task(
        app,
        f"purging {queue_name}",
        lambda progress: app.broker.purge(queue_name, progress=progress, **where),
        as_json,
    )


# Audit and demo ---------------------------------------------------------------------------
def _audit_json(report: AuditReport) -> dict[str, Any]:
    entries = [{**dataclasses.asdict(e), "ok": e.ok} for e in report.entries]
    totals = {"sent": report.sent, "completed": report.completed, "dropped": report.dropped}
    return {"ok": report.ok, **totals, "held": report.held, "entries": entries}


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
        for e in report.entries
    ]
    verdict = "balanced" if report.ok else "OUT OF BALANCE"
    summary = Text(
        f"{verdict}: sent {report.sent} = completed {report.completed} + dropped "
        f"{report.dropped} + held {report.held}",
        style="green" if report.ok else "bold red",
    )
    return Group(_table("ledger", columns, rows), summary)


@cli.command()
@json_option
@click.pass_obj
def audit(app: App, /, as_json: bool) -> None:
    """Check that no message was lost.

    Every message ever sent must be completed, dropped or still held somewhere, and every
    entity's ledger must balance. Exit code 1 if not.
    """
    report = app.broker.audit()
    _emit(app, as_json, _audit_json(report), lambda: _audit_render(report))
    if not report.ok:
        app.ctx.exit(1)


@cli.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo"),
    show_default=True,
    help="Directory for the demo's store (its demo.db is replaced).",
)
@click.option(
    "--orders",
    type=click.IntRange(min=100),
    default=20_000,
    show_default=True,
    help="How many purchase orders to send.",
)
def demo(directory: Path, orders: int) -> None:
    """Run the end-to-end demo.

    It sends purchase orders, processes them with failures of every kind, and
    check that each one was completed once or dead-lettered with the right reason."""
    run_demo(directory=directory, orders=orders)


def main() -> None:
    """The console script ``poisonq``."""
    cli()
