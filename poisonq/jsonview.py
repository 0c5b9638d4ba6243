"""JSON forms of what the broker reports (messages, queues, dead-letter groups, tasks), shared
by the command line's ``--json`` and the HTTP API so both speak the same shapes.

Times are ISO 8601 in UTC. A body that is UTF-8 text is given as text, any other body as
base64, and ``body_encoding`` says which.
"""

from __future__ import annotations

import base64
import dataclasses
from datetime import UTC, datetime
from typing import Any

from poisonq.model import ReceivedMessage
from poisonq.reports import QueueInfo
from poisonq.store.base import DeadLetterGroup, TaskRecord


def iso_time(value: datetime | float | None) -> str | None:
    """ISO 8601 in UTC (a float is seconds since the epoch)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.isoformat()


def body_json(body: bytes) -> dict[str, str]:
    """A body as UTF-8 text, or base64 when it is not text."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "body_encoding": "base64"}


def message_json(message: ReceivedMessage) -> dict[str, Any]:
    """Every field of a message, with its failure history."""
    data: dict[str, Any] = {}
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        data[field.name] = iso_time(value) if isinstance(value, datetime) else value
    data.update(body_json(message.body))
    data["failures"] = [
        {**failure.to_json(), "time": iso_time(failure.time)} for failure in message.failures
    ]
    return data


def queue_json(info: QueueInfo) -> dict[str, Any]:
    """A queue (or subqueue) with its options, counts and ledger."""
    options = info.options.to_json()
    options["max_delivery_count"] = info.options.max_delivery_count
    return {
        "name": info.name,
        "kind": info.kind,
        "subqueue": info.subqueue,
        "status": info.status,
        "status_cause": info.status_cause,
        "event": info.event.to_json() if info.event else None,
        "filter": info.filter,
        "options": options,
        "counts": info.counts,
        "ledger": dataclasses.asdict(info.ledger),
        "created_at": iso_time(info.created_at),
        "updated_at": iso_time(info.updated_at),
    }


def group_json(group: DeadLetterGroup) -> dict[str, Any]:
    return {
        **dataclasses.asdict(group),
        "first_seen": iso_time(group.first_seen),
        "last_seen": iso_time(group.last_seen),
    }


def task_json(record: TaskRecord) -> dict[str, Any]:
    times = {"created_at": iso_time(record.created_at), "updated_at": iso_time(record.updated_at)}
    return {**dataclasses.asdict(record), **times}
