"""What the engine reports about entities: properties, counts, the audit, tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from poisonq.model import EntityStatus, SubQueue
from poisonq.options import QueueOptions
from poisonq.store.base import Ledger


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


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One entity's ledger check: ``sent + moved_in == completed + dropped + moved_out + held``."""

    name: str
    sent: int
    moved_in: int
    completed: int
    dropped: int
    moved_out: int
    held: int

    @property
    def ok(self) -> bool:
        return (
            self.sent + self.moved_in == self.completed + self.dropped + self.moved_out + self.held
        )


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
