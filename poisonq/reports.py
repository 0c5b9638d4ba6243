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


DELETED_ENTITIES = "(deleted entities)"
"""The name of :attr:`AuditReport.deleted`, which no entity can have."""


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Every entity's ledger, and the global balance: every message ever sent was completed,
    dropped, or is still held somewhere (moves between entities cancel out).

    ``deleted`` sums the ledgers of the entities deleted, as each was when it went, the
    messages it still held counted as dropped: a queue deleted with messages moved in from
    another took its side of the move with it, and the balance needs it."""

    entries: list[AuditEntry] = field(default_factory=list)
    deleted: AuditEntry = field(
        default_factory=lambda: AuditEntry(DELETED_ENTITIES, 0, 0, 0, 0, 0, 0)
    )

    @property
    def _all(self) -> list[AuditEntry]:
        return [*self.entries, self.deleted]

    @property
    def rows(self) -> list[AuditEntry]:
        """What a report shows: the entries, and ``deleted`` once an entity with messages
        went."""
        gone = self.deleted
        return [*self.entries, *([gone] if gone.sent or gone.moved_in else [])]

    @property
    def sent(self) -> int:
        return sum(e.sent for e in self._all)

    @property
    def completed(self) -> int:
        return sum(e.completed for e in self._all)

    @property
    def dropped(self) -> int:
        return sum(e.dropped for e in self._all)

    @property
    def held(self) -> int:
        return sum(e.held for e in self.entries)

    @property
    def balanced(self) -> bool:
        """The global balance alone: sent = completed + dropped + held."""
        return self.sent == self.completed + self.dropped + self.held

    @property
    def ok(self) -> bool:
        return self.balanced and all(e.ok for e in self._all)
