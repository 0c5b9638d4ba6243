"""The Spark schema of a message and its conversion to Arrow record batches.

Readers yield Arrow record batches, built column by column, because a Python tuple per row
is the slow path of the Python Data Source API. One schema serves every read: a peek of a
queue or dead-letter queue fills every column, a lease read (streaming, pipeline) fills the
columns a consumer needs and leaves the dead-letter ones null.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from poisonq.model import ReceivedMessage
from poisonq.store.base import LEASE_COLUMNS

MESSAGE_SCHEMA_DDL = (
    "sequence_number bigint, message_id string, body binary, content_type string,"
    " subject string, properties map<string,string>, session_id string,"
    " correlation_id string, reply_to string, state string, enqueued_time timestamp,"
    " scheduled_enqueue_time timestamp, expires_at timestamp, delivery_count int,"
    " dead_letter_reason string, dead_letter_error_description string,"
    " dead_letter_source string, last_error_type string, last_fingerprint string,"
    " failure_count int"
)

_TIME = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("sequence_number", pa.int64()),
        ("message_id", pa.string()),
        ("body", pa.binary()),
        ("content_type", pa.string()),
        ("subject", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("session_id", pa.string()),
        ("correlation_id", pa.string()),
        ("reply_to", pa.string()),
        ("state", pa.string()),
        ("enqueued_time", _TIME),
        ("scheduled_enqueue_time", _TIME),
        ("expires_at", _TIME),
        ("delivery_count", pa.int32()),
        ("dead_letter_reason", pa.string()),
        ("dead_letter_error_description", pa.string()),
        ("dead_letter_source", pa.string()),
        ("last_error_type", pa.string()),
        ("last_fingerprint", pa.string()),
        ("failure_count", pa.int32()),
    ]
)


def _properties(text: str | None) -> list[tuple[str, str]]:
    """Properties as map entries; Spark maps have one value type, so values become text."""
    if text is None:
        return []
    return [(key, _text(value)) for key, value in json.loads(text).items()]


def _no_properties(n: int, kind: pa.MapType) -> pa.MapArray:
    """``n`` empty maps, built whole. Empty, not null, as a peek reads a message without
    properties: Spark converts a null map to Arrow a hundred times slower than an empty one
    (PySpark 4.x: ``mapInArrow`` over a lease with null properties took 3.3 s a 100,000 rows
    against 0.5 s), so a user's Arrow or pandas function over whole messages would pay it."""
    offsets = pa.array([0] * (n + 1), pa.int32())
    return pa.MapArray.from_arrays(
        offsets, pa.array([], kind.key_type), pa.array([], kind.item_type), type=kind
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1_000_000)


def lease_batch(rows: Sequence[tuple[Any, ...]]) -> pa.RecordBatch:
    """A record batch from lease rows (tuples of :data:`LEASE_COLUMNS`), built a column at a
    time: this runs for every message a pipeline or a stream reads, so no column that Arrow
    can build whole (the enqueue times, the state, properties when no message has any) is
    built a Python call per row."""
    columns = dict(zip(LEASE_COLUMNS, zip(*rows, strict=True), strict=True)) if rows else {}
    n = len(rows)
    arrays = []
    for field in ARROW_SCHEMA:
        match field.name:
            case "properties":
                texts = columns.get("properties", ())
                absent = texts.count(None) == n
                arrays.append(
                    _no_properties(n, field.type)
                    if absent
                    else pa.array([_properties(text) for text in texts], field.type)
                )
            case "enqueued_time":
                seconds = pa.array(columns.get("enqueued_time", ()), pa.float64())
                micros = pc.round(pc.multiply(seconds, 1_000_000))
                arrays.append(pc.cast(micros, pa.int64()).cast(field.type))
            case "state":
                arrays.append(pa.repeat(pa.scalar("locked", field.type), n))
            case name:
                values = columns.get(name)
                arrays.append(
                    pa.nulls(n, field.type) if values is None else pa.array(values, field.type)
                )
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def message_batch(messages: Sequence[ReceivedMessage]) -> pa.RecordBatch:
    """A record batch of peeked messages, every column filled."""
    rows: dict[str, list[Any]] = {field.name: [] for field in ARROW_SCHEMA}
    for m in messages:
        last = m.failures[-1] if m.failures else None
        for name, value in (
            ("sequence_number", m.sequence_number),
            ("message_id", m.message_id),
            ("body", m.body),
            ("content_type", m.content_type),
            ("subject", m.subject),
            ("properties", [(k, _text(v)) for k, v in m.properties.items()]),
            ("session_id", m.session_id),
            ("correlation_id", m.correlation_id),
            ("reply_to", m.reply_to),
            ("state", str(m.state)),
            ("enqueued_time", m.enqueued_time),
            ("scheduled_enqueue_time", m.scheduled_enqueue_time),
            ("expires_at", m.expires_at),
            ("delivery_count", m.delivery_count),
            ("dead_letter_reason", m.dead_letter_reason),
            ("dead_letter_error_description", m.dead_letter_error_description),
            ("dead_letter_source", m.dead_letter_source),
            ("last_error_type", last.error_type if last else None),
            ("last_fingerprint", last.fingerprint if last else None),
            ("failure_count", len(m.failures)),
        ):
            rows[name].append(value)
    return pa.RecordBatch.from_pydict(rows, schema=ARROW_SCHEMA)
