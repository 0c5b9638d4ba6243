"""The options that select messages by their fields, declared once for every command that
takes them (``peek``, ``dlq resubmit``, ``dlq purge``), and their values for the broker.

``none`` as a reason, subject or fingerprint selects the messages without one (the
``(none)`` group of ``dlq list``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from poisonq.cli.app import apply_options
from poisonq.client import spelled_filters

_NONE = " 'none': those without one."
_FIELDS = (
    click.option("--reason", help="Only messages dead-lettered with this reason;" + _NONE),
    click.option("--subject", help="Only messages with this subject;" + _NONE),
    click.option(
        "--fingerprint", help="Only messages whose last failure has this fingerprint;" + _NONE
    ),
)
_RANGES = (
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
    click.option("--message-id", help="Only the message(s) with this message id."),
    click.option("--body-contains", metavar="TEXT", help="Only messages whose body holds TEXT."),
)
field_filters = apply_options(_FIELDS)
dlq_filters = apply_options((*_FIELDS, *_RANGES))


def _timestamp(value: datetime) -> float:
    """Seconds since the epoch; a time given without a zone is local time."""
    return value.astimezone().timestamp()


def filter_arguments(given: dict[str, Any]) -> dict[str, Any]:
    """Filter keyword arguments for the broker from the options given."""
    where = {k: v for k, v in given.items() if v is not None}
    for name in ("since", "until"):
        if name in where:
            where[name] = _timestamp(where[name])
    return spelled_filters(where)
