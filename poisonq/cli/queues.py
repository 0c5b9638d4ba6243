"""``poisonq queue create|list|show|update|enable|disable|delete``: entity administration."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.columns import Columns
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from poisonq.cli.app import App, apply_options
from poisonq.cli.output import emit, json_option, table
from poisonq.jsonview import queue_json
from poisonq.model import FaultAction, ReceiveErrorHandling
from poisonq.options import QueueOptions, RetryPolicy
from poisonq.reports import QueueInfo

NEVER = "never"


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
    click.option(
        "--receive-retry-count",
        type=click.IntRange(min=0),
        help="Immediate redeliveries per cycle (max-delivery-count - 1) [default: 9].",
    ),
    click.option(
        "--max-retry-cycles",
        type=click.IntRange(min=0),
        help="Cycles through the retry subqueue before poisoning [default: 0].",
    ),
    click.option("--retry-cycle-delay", type=float, help="Seconds a message waits between cycles."),
    click.option(
        "--retry-cycle-delay-multiplier",
        type=float,
        help="Growth of the delay per cycle (>= 1) [default: 1].",
    ),
    click.option(
        "--redelivery-delay",
        type=float,
        help="Seconds before a failed message is delivered again [default: 0, at once].",
    ),
    click.option(
        "--redelivery-delay-multiplier",
        type=float,
        help="Growth of that delay per failure in a cycle (>= 1) [default: 2].",
    ),
    click.option(
        "--max-redelivery-delay",
        type=float,
        help="Longest delay before a redelivery, in seconds [default: 300].",
    ),
    click.option(
        "--receive-error-handling",
        type=click.Choice([h.value for h in ReceiveErrorHandling]),
        help="What happens to a poison message [default: move].",
    ),
    click.option(
        "--requires-session/--no-requires-session",
        default=None,
        help="Receive by session; a message without session_id is dead-lettered.",
    ),
    click.option(
        "--per-message-poisoning/--no-per-message-poisoning",
        default=None,
        help="Poison only the message, not its whole session [default: whole session].",
    ),
    click.option("--forward-to", help="Forward every message to this queue."),
    click.option(
        "--forward-dead-lettered-messages-to", help="Forward dead-lettered messages here."
    ),
)
queue_options = apply_options(_QUEUE_OPTIONS)
_RETRY_FIELDS = (
    "receive_retry_count",
    "max_retry_cycles",
    "retry_cycle_delay",
    "retry_cycle_delay_multiplier",
    "receive_error_handling",
    "redelivery_delay",
    "redelivery_delay_multiplier",
    "max_redelivery_delay",
)


def _queue_changes(options: dict[str, Any], policy: RetryPolicy | None = None) -> dict[str, Any]:
    """The queue options given on the command line (``never`` meaning none). Retry fields
    change ``policy`` (the queue's own on update, the default on create), and
    ``--max-delivery-count`` given with them sets ``receive_retry_count``."""
    given: dict[str, Any] = {
        k: (None if v == NEVER else v) for k, v in options.items() if v is not None
    }
    retry: dict[str, Any] = {name: given.pop(name) for name in _RETRY_FIELDS if name in given}
    if retry:
        if "max_delivery_count" in given:
            retry.setdefault("receive_retry_count", given.pop("max_delivery_count") - 1)
        given["retry"] = dataclasses.replace(policy or RetryPolicy(), **retry)
    return given


def _queue_detail(info: QueueInfo) -> RenderableType:
    """The queue's status and options (the retry policy flattened) beside its counts."""
    data = queue_json(info)
    options = data.pop("options")
    retry = {f"retry.{k}": v for k, v in options.pop("retry").items()}
    event = {f"event.{k}": v for k, v in (data.pop("event") or {}).items()}
    plain = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    rows = [*plain, *event.items(), *options.items(), *retry.items()]
    about = table(f"queue {info.name}", ["property", "value"], rows)
    counts = table("messages", ["state", "count"], info.counts.items())
    return Columns([about, counts])


def _show_queue(app: App, info: QueueInfo, as_json: bool) -> None:
    emit(app, as_json, queue_json(info), lambda: _queue_detail(info))


COUNT_COLUMNS = ("active", "scheduled", "locked", "deferred", "dead_lettered", "completed")


def _queues_table(queues: list[QueueInfo]) -> Table:
    rows = [[q.name, q.kind, q.status, *(q.counts[c] for c in COUNT_COLUMNS)] for q in queues]
    headers = [c.replace("_", " ") for c in COUNT_COLUMNS]
    return table("queues", ["name", "kind", "status", *headers], rows)


@click.group()
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
    emit(app, as_json, [queue_json(q) for q in queues], lambda: _queues_table(queues))


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
    changes = _queue_changes(options, app.broker.get_queue(name).options.retry)
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

    Deletes NAME with its subqueues (a topic with its subscriptions) and every message they
    hold; their ledgers stay in the audit.
    """
    app.broker.get_queue(name)  # a name that is not there fails before the question
    family = [e for e in app.broker.entities() if e.name == name or e.name.startswith(f"{name}/")]
    held = sum(e.ledger.held for e in family)
    if not yes:
        click.confirm(
            f"Delete queue {name!r} and the {held} message(s) it holds?", abort=True, err=True
        )
    app.broker.delete_queue(name)
    app.out.print(Text(f"deleted queue {name} and the {held} message(s) it held"))


@queue.command("resolve")
@click.argument("name")
@click.argument("sequence_number", metavar="SEQ", type=int)
@click.option(
    "--action",
    type=click.Choice(["move", "drop", "resubmit"]),
    default="move",
    show_default=True,
    help="move: to the dead-letter queue; drop: delete; resubmit: back of the queue.",
)
@click.option("--keep-disabled", is_flag=True, help="Do not enable the queue afterwards.")
@json_option
@click.pass_obj
def queue_resolve(
    app: App,
    /,
    name: str,
    sequence_number: int,
    action: FaultAction,
    keep_disabled: bool,
    as_json: bool,
) -> None:
    """Get a faulted queue going again.

    Moves, drops or resubmits poison message SEQ of NAME (the sequence number the fault
    reports) and enables the queue, in one transaction.
    """
    info = app.broker.resolve_poison(name, sequence_number, action, enable=not keep_disabled)
    _show_queue(app, info, as_json)
