"""What the engine reports about entities: properties, counts, the audit, tasks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from poisonq.model import (
    DEAD_LETTER_QUEUES,
    EntityKind,
    EntityStatus,
    StatusEventKind,
    SubQueue,
    from_timestamp,
)
from poisonq.options import QueueOptions
from poisonq.store.base import Ledger


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """Why an entity's status changed: a fault on a poison message (with its sequence
    number), an auto-disable after consecutive rollbacks, or an operator. The engine keeps it
    as JSON in the entity's ``status_cause``."""

    kind: StatusEventKind
    time: float
    description: str
    sequence_number: int | None = None
    rollbacks: int | None = None
    pending: tuple[int, ...] = ()  # further poison messages of a fault, in their turn

    def to_text(self) -> str:
        return json.dumps(
            {
                "kind": self.kind.value,
                "time": self.time,
                "description": self.description,
                "sequence_number": self.sequence_number,
                "rollbacks": self.rollbacks,
                "pending": list(self.pending),
            }
        )

    @classmethod
    def from_text(cls, text: str | None, time: float) -> StatusEvent | None:
        """The event a ``status_cause`` holds; plain text (an operator's note) becomes an
        operator event."""
        if not text:
            return None
        try:
            data: dict[str, Any] = json.loads(text)
            return cls(
                StatusEventKind(data["kind"]),
                float(data["time"]),
                str(data["description"]),
                data.get("sequence_number"),
                data.get("rollbacks"),
                tuple(int(seq) for seq in data.get("pending", ())),
            )
        except (ValueError, KeyError, TypeError):
            return cls(StatusEventKind.OPERATOR, time, text)

    def to_json(self) -> dict[str, Any]:
        when = from_timestamp(self.time)
        return {
            "kind": self.kind.value,
            "time": when.isoformat() if when else None,
            "description": self.description,
            "sequence_number": self.sequence_number,
            "rollbacks": self.rollbacks,
            "pending": list(self.pending),
        }


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue (or subqueue) as ``Broker.get_queue`` shows it."""

    name: str
    subqueue: SubQueue | None
    status: EntityStatus
    status_cause: str | None
    options: QueueOptions
    counts: dict[str, int]
    ledger: Ledger
    created_at: datetime
    updated_at: datetime
    kind: EntityKind = EntityKind.QUEUE
    event: StatusEvent | None = None
    filter: dict[str, Any] | None = None
    dead_letter_on_filter_exceptions: bool = False  # a subscription's, as created

    @property
    def receivable(self) -> int:
        """The messages a receive or a lease could take here now: the active ones, or in a
        dead-letter queue the dead-lettered ones."""
        return self.counts["dead_lettered" if self.subqueue in DEAD_LETTER_QUEUES else "active"]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One entity's ledger check: ``sent + moved_in == completed + dropped + moved_out + held``;
    and for a dead-letter queue, that its kept aggregates (the groups the explorer, ``/metrics``
    and ``poisonq dlq list`` read) equal a recount of its messages."""

    name: str
    sent: int
    moved_in: int
    completed: int
    dropped: int
    moved_out: int
    held: int
    aggregates_match: bool = True

    @property
    def ok(self) -> bool:
        balanced = (
            self.sent + self.moved_in == self.completed + self.dropped + self.moved_out + self.held
        )
        return balanced and self.aggregates_match


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Every entity's ledger, and the global balance: every message ever sent was completed,
    dropped, or is still held somewhere (moves between entities cancel out)."""

    entries: list[AuditEntry] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(e.sent for e in self.entries)

    @property
    def completed(self) -> int:
        return sum(e.completed for e in self.entries)

    @property
    def dropped(self) -> int:
        return sum(e.dropped for e in self.entries)

    @property
    def held(self) -> int:
        return sum(e.held for e in self.entries)

    @property
    def ok(self) -> bool:
        balanced = self.sent == self.completed + self.dropped + self.held
        return balanced and all(e.ok for e in self.entries)
