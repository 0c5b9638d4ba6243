"""``poisonq send``, ``receive`` and ``peek``: messages in and out from the command line.

``send`` takes bodies as arguments or JSON lines from a file or stdin, sent in batches that
are each one transaction, so a bad line is reported by number and nothing of its batch is
sent.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from typing import IO, Any

import click
from rich.text import Text

from poisonq.cli.app import App
from poisonq.cli.filters import field_filters, filter_arguments
from poisonq.cli.output import emit, json_option, messages_table, progress
from poisonq.cli.paths import FileParam
from poisonq.errors import InvalidOptionError, PoisonqError
from poisonq.jsonview import message_json
from poisonq.model import Message, PropertyValue, ReceivedMessage, ReceiveMode
from poisonq.receivers import Receiver

SEND_BATCH = 500
TEXT_FIELDS = ("message_id", "subject", "content_type", "correlation_id", "reply_to", "session_id")
LINE_FIELDS = ("body", *TEXT_FIELDS, "properties", "time_to_live")


class PartialSendError(PoisonqError):
    """A send from the command line stopped part way: earlier batches were sent (each batch
    is all or nothing), the failing batch and everything after it were not."""


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
    with progress(app, f"sending to {address}") as update:
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


@click.command()
@click.argument("address")
@click.argument("bodies", metavar="[BODY]...", nargs=-1)
@click.option(
    "--file",
    "source",
    type=FileParam("rb"),
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
@click.option("--session-id", help="Session of the messages (required by a session queue).")
@click.option("--correlation-id", help="Correlation id.")
@click.option("--reply-to", help="The sender's queue (where 'reject' dead-letters a poison one).")
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
    session_id: str | None,
    correlation_id: str | None,
    reply_to: str | None,
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
        ("session_id", session_id),
        ("correlation_id", correlation_id),
        ("reply_to", reply_to),
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
    emit(app, as_json, data, lambda: Text(f"sent {len(sent)} message(s) to {address}"))


# Receiving --------------------------------------------------------------------------------
SETTLE_CHOICES = ("complete", "abandon", "defer", "none")


@click.command()
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
    help="Seconds to wait for the first message (with --next-session, for a session first).",
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
@click.option("--session", "session_id", help="Accept this session of a session queue.")
@click.option(
    "--next-session", is_flag=True, help="Accept the next session with messages nobody holds."
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
    session_id: str | None,
    next_session: bool,
    as_json: bool,
) -> None:
    """Receive messages and settle them.

    Receives up to --max messages from ADDRESS and completes them (so a receive consumes
    them) unless --settle says otherwise. A session queue is received from by session
    (--session ID or --next-session), in order; the session is given up afterwards.
    """
    receive_mode = ReceiveMode(mode.replace("-", "_"))
    if receive_mode is ReceiveMode.RECEIVE_AND_DELETE and settle not in (None, "none"):
        raise click.UsageError("messages received with receive-and-delete cannot be settled")
    sessions = session_id is not None or next_session
    if sessions and (session_id is not None) == next_session:
        raise click.UsageError("give --session ID or --next-session, not both")
    if sessions and receive_mode is ReceiveMode.RECEIVE_AND_DELETE:
        raise click.UsageError("a session is received from in peek-lock mode")
    receiver: Receiver | None
    if session_id is not None:
        receiver = app.broker.accept_session(address, session_id)
    elif next_session:
        receiver = app.broker.accept_next_session(address, max_wait=wait)
    else:
        receiver = app.broker.receiver(address, receive_mode=receive_mode)
    messages = [] if receiver is None else _receive(receiver, max_messages, wait, settle)
    data = [message_json(m) for m in messages]
    emit(app, as_json, data, lambda: messages_table(f"received from {address}", messages))


def _receive(
    receiver: Receiver, max_messages: int, wait: float, settle: str | None
) -> list[ReceivedMessage]:
    with receiver:
        messages = receiver.receive(max_messages=max_messages, max_wait=wait)
        if messages and receiver.receive_mode is ReceiveMode.PEEK_LOCK:
            match settle or "complete":
                case "complete":
                    receiver.complete(messages)
                case "abandon":
                    receiver.abandon(messages)
                case "defer":
                    receiver.defer(messages)
    return messages


@click.command()
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
@field_filters
@json_option
@click.pass_obj
def peek(
    app: App, /, address: str, max_messages: int, from_sequence: int, as_json: bool, **filters: Any
) -> None:
    """Look at messages without receiving them.

    Shows the messages of ADDRESS (a queue or a subqueue such as 'orders/$deadletterqueue')
    that match the filters, without locking them or counting a delivery.
    """
    where = filter_arguments(filters)
    messages = app.broker.peek(
        address, from_sequence=from_sequence, max_messages=max_messages, **where
    )
    data = [message_json(m) for m in messages]
    emit(app, as_json, data, lambda: messages_table(f"messages in {address}", messages))
