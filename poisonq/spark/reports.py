"""What a pipeline run did, and the error that stops one: shared by the runner, the batch
writer and the streaming helper."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from poisonq.defects import Defect
from poisonq.errors import EntityDisabledError, PoisonqError


class PipelineStoppedError(PoisonqError):
    """The runner stopped: a batch showed a defect (its messages are back in the queue, no
    delivery counted: ``defect`` has the first failure and its traceback), or the queue
    stopped delivering (faulted on a poison message, auto-disabled, disabled: ``cause`` is
    the queue's error). ``report`` says what was done until then."""

    def __init__(
        self,
        report: PipelineReport,
        error: str,
        *,
        cause: EntityDisabledError | None = None,
        defect: Defect | None = None,
    ) -> None:
        super().__init__(error)
        self.report = report
        self.cause = cause
        self.defect = defect

    @property
    def traceback(self) -> str:
        """The defect's first failure as its traceback (or job error) shows it."""
        return self.defect.failure.traceback if self.defect else ""


class PipelineInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run (a :class:`KeyboardInterrupt`, caught as one): ``report``
    says what was done until then. The batch in hand stays locked, and the next run of
    the consumer replays it (``report.unfinished`` messages); the lease taken ahead for
    the batch after it is given back with no delivery counted."""

    def __init__(self, report: PipelineReport) -> None:
        super().__init__(f"interrupted after {report.batches} batch(es)")
        self.report = report


@dataclass
class PipelineReport:
    """What a run did; ``dead_lettered`` counts by reason."""

    batches: int = 0
    leased: int = 0
    completed: int = 0
    retried: int = 0
    released: int = 0  # given back without a delivery counted (a defect, a stop)
    unfinished: int = 0  # held by a batch the run left (Ctrl-C): the next run replays it
    dead_lettered: Counter[str] = field(default_factory=Counter)
    isolation_jobs: int = 0
    elapsed: float = 0.0

    @property
    def messages_per_second(self) -> float:
        return self.leased / self.elapsed if self.elapsed else 0.0
