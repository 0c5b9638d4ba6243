"""The request bodies of the HTTP API (and so its OpenAPI document).

These only shape and type-check what arrives; the broker validates the values (names, sizes,
rates) and its errors come back as 4xx answers with the error's type and text.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from poisonq.client import spelled_filters
from poisonq.errors import InvalidOptionError
from poisonq.model import Message, PropertyValue

MAX_BATCH = 1000


class MessageIn(BaseModel):
    """A message to send. ``body`` is text, or base64 with ``body_encoding: base64``."""

    model_config = ConfigDict(extra="forbid")

    body: str = ""
    body_encoding: Literal["utf-8", "base64"] = "utf-8"
    message_id: str | None = None
    content_type: str | None = None
    subject: str | None = None
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    session_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    time_to_live: float | None = Field(default=None, description="seconds")
    scheduled_enqueue_time: datetime | None = None

    def to_message(self) -> Message:
        if self.body_encoding == "base64":
            try:
                body: bytes | str = base64.b64decode(self.body, validate=True)
            except binascii.Error:
                raise InvalidOptionError("body is not valid base64") from None
        else:
            body = self.body
        fields = self.model_dump(exclude={"body", "body_encoding"}, exclude_none=True)
        return Message(body=body, **fields)


class SendRequest(BaseModel):
    """One batch: sent in one transaction, all or nothing."""

    model_config = ConfigDict(extra="forbid")

    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_BATCH)


class SendResult(BaseModel):
    sequence_numbers: list[int]


_NONE = "; 'none': the messages without one"


class Filters(BaseModel):
    """Which dead-lettered messages a listing, resubmit or purge takes (all by default)."""

    reason: str | None = Field(default=None, description="dead-letter reason" + _NONE)
    subject: str | None = Field(default=None, description="subject" + _NONE)
    fingerprint: str | None = Field(
        default=None, description="fingerprint of the last failure" + _NONE
    )
    min_sequence: int | None = None
    max_sequence: int | None = None
    since: datetime | None = Field(default=None, description="dead-lettered at or after")
    until: datetime | None = Field(default=None, description="dead-lettered before")
    message_id: str | None = None
    body_contains: str | None = Field(
        default=None, description="text the body holds (a scan of the dead-letter queue)"
    )

    def where(self) -> dict[str, Any]:
        """Keyword filters for ``Broker.resubmit``/``purge``; times as epoch seconds (a time
        without a zone is UTC)."""
        given = self.model_dump(include=set(Filters.model_fields), exclude_none=True)
        for name in ("since", "until"):
            if name in given:
                given[name] = _epoch(given[name])
        return spelled_filters(given)


class PurgeRequest(Filters):
    model_config = ConfigDict(extra="forbid")


class ResubmitRequest(Filters):
    model_config = ConfigDict(extra="forbid")

    to: str | None = Field(default=None, description="another queue to send them to")
    rate: float | None = Field(
        default=500.0, gt=0, description="messages per second; null for no limit"
    )


class GroupOut(BaseModel):
    key: str | None
    label: str | None
    count: int
    first_seen: str
    last_seen: str


class SeriesOut(BaseModel):
    key: str | None = Field(description="the reason, subject or fingerprint; null: none")
    error_type: str | None = Field(
        default=None,
        description="by fingerprint: the error type of its failures, kept after its messages"
        " were resubmitted or purged",
    )
    counts: list[int] = Field(description="messages dead-lettered in each step, oldest first")


class TimelineOut(BaseModel):
    start: datetime = Field(description="when the first step begins")
    step: int = Field(description="seconds each count covers")
    series: list[SeriesOut]


class TaskOut(BaseModel):
    id: int
    kind: str
    entity_id: int
    entity: str = Field(description="the address it takes messages from")
    status: Literal["running", "completed", "cancelled", "failed"]
    spec: dict[str, Any] = Field(description="what it selects (`where`), its `rate` and `to`")
    total: int
    done: int
    created_at: str
    updated_at: str
    error: str | None
    started_by: str | None = Field(
        description="the operator's name at the web UI's login, `user@host (cli)` for the"
        " command line, `a client of the API`, or what a program gave; null: not recorded"
    )
    cancelled_by: str | None = Field(description="who cancelled it, named as `started_by`")


def _epoch(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
