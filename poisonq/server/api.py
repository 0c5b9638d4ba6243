"""The JSON API under ``/api``: entities and counts, send and peek, the dead-letter queue
(groups, listing, message detail with its failure history), resubmit and purge as tracked
tasks, the pipelines' timelines. Reads need the token unless the server opened them; writes
always do.

Entity names may contain ``/`` (subscription paths), so a queue is the path up to the
route's fixed suffix (``/api/queues/events/subscriptions/audit/counts``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from poisonq.client import group_label, grouping_for
from poisonq.errors import NothingSelectedError
from poisonq.jsonview import group_json, message_json, queue_json, task_json
from poisonq.names import parse_address
from poisonq.server.schemas import (
    Filters,
    GroupOut,
    PurgeRequest,
    ResubmitRequest,
    SendRequest,
    SendResult,
    SeriesOut,
    TaskOut,
    TimelineOut,
)
from poisonq.server.state import ServerState, server_state

_bearer = HTTPBearer(
    auto_error=False, description="The server's token (--token-file, or the file it names)."
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
State = Annotated[ServerState, Depends(server_state)]
MAX_LIST = 1000


def _read(request: Request, state: State, _: Credentials) -> None:
    state.auth.require_read(request)


def _write(request: Request, state: State, _: Credentials) -> None:
    state.auth.require_write(request)


reads = APIRouter(prefix="/api", dependencies=[Depends(_read)], tags=["read"])
writes = APIRouter(prefix="/api", dependencies=[Depends(_write)], tags=["write"])
Limit = Annotated[int, Query(ge=1, le=MAX_LIST)]


@reads.get("/entities", summary="Every queue and subqueue with counts and ledger")
def entities(state: State) -> list[dict[str, Any]]:
    return [queue_json(info) for info in state.broker.entities()]


@reads.get("/queues/{queue:path}/counts", summary="Messages held by state")
def counts(state: State, queue: str) -> dict[str, int]:
    return state.broker.counts(queue)


@reads.get("/queues/{queue:path}/messages", summary="Peek: messages without locking them")
def peek(
    state: State,
    queue: str,
    subqueue: Literal["deadletter", "retry", "transfer_deadletter"] | None = None,
    from_sequence: Annotated[int, Query(ge=0)] = 0,
    limit: Limit = 100,
) -> list[dict[str, Any]]:
    address = str(parse_address(queue, subqueue))
    return [
        message_json(m)
        for m in state.broker.peek(address, from_sequence=from_sequence, max_messages=limit)
    ]


@reads.get("/queues/{queue:path}/messages/{sequence_number}", summary="One message")
def message(
    state: State,
    queue: str,
    sequence_number: int,
    subqueue: Literal["deadletter", "retry", "transfer_deadletter"] | None = None,
) -> dict[str, Any]:
    """Every field of one message, with its failure history."""
    return message_json(state.broker.message(str(parse_address(queue, subqueue)), sequence_number))


@reads.get("/queues/{queue:path}/deadletters/groups", summary="Dead-letters in groups")
def groups(
    state: State, queue: str, by: Literal["reason", "subject", "fingerprint"] = "reason"
) -> list[GroupOut]:
    """Dead-lettered messages grouped by reason, subject or failure fingerprint, with
    counts and when the first and last of each group were dead-lettered."""
    return [GroupOut(**group_json(g)) for g in state.broker.dead_letter_groups(queue, by)]


@reads.get("/queues/{queue:path}/deadletters/timeline", summary="Dead-letterings over time")
def timeline(
    state: State,
    queue: str,
    by: Literal["reason", "subject", "fingerprint"] = "reason",
    window: Literal["hour", "day", "week"] = "day",
) -> TimelineOut:
    """Messages dead-lettered over the last hour (a count a minute), day (per 15 minutes) or
    week (per hour), one series per reason, subject or fingerprint, the largest first: the
    explorer's chart, from the history the store keeps (what was purged or resubmitted
    since still counts)."""
    found = state.broker.dead_letter_timeline(queue, by, window)
    types = state.broker.dead_letter_fingerprints(queue) if by == "fingerprint" else {}
    return TimelineOut(
        start=datetime.fromtimestamp(found.start, UTC),
        step=found.step,
        series=[
            SeriesOut(key=key, error_type=types.get(key or "", (None, None))[0], counts=counts)
            for key, counts in found.series.items()
        ],
    )


@reads.get("/queues/{queue:path}/deadletters", summary="Dead-lettered messages")
def dead_letters(
    state: State,
    queue: str,
    filters: Annotated[Filters, Query()],
    after: Annotated[int, Query(ge=0, description="sequence number to list after")] = 0,
    limit: Limit = 100,
) -> list[dict[str, Any]]:
    """The dead-lettered messages a resubmit or purge with these filters would take."""
    found = state.broker.dead_letters(queue, after=after, limit=limit, **filters.where())
    return [message_json(m) for m in found]


@reads.get("/pipelines", summary="Pipeline consumers with a timeline")
def pipelines(state: State) -> list[dict[str, Any]]:
    """Every pipeline consumer with recorded batches: its queue, how many batches the store
    keeps of it, and its last batch."""
    return [summary.to_json() for summary in state.broker.pipelines()]


@reads.get("/pipelines/{consumer:path}/batches", summary="A pipeline consumer's timeline")
def pipeline_batches(state: State, consumer: str, queue: str | None = None) -> list[dict[str, Any]]:
    """The batches the store keeps of ``consumer``, oldest first: when each started, how long
    it ran, its size, how many of its messages were completed, retried and dead-lettered (by
    reason), and its isolation jobs. ``queue`` only when the consumer runs on several."""
    return [batch.to_json() for batch in state.broker.pipeline_batches(consumer, queue)]


@reads.get("/tasks", summary="Resubmit and purge tasks, newest first")
def tasks(
    state: State,
    queue: str | None = None,
    before: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[TaskOut]:
    """Every resubmit and purge, whichever process ran it, newest first: who started and
    who cancelled it, what it selected and at what rate, how far it got. ``queue`` keeps
    those on its dead letters; ``before`` (a task id) pages back."""
    return [TaskOut(**task_json(r)) for r in state.broker.tasks(queue, before=before, limit=limit)]


@reads.get("/tasks/{task_id}", summary="A resubmit or purge task's progress")
def task(state: State, task_id: int) -> TaskOut:
    return TaskOut(**task_json(state.broker.task(task_id)))


@writes.post("/queues/{queue:path}/messages", summary="Send a batch", status_code=201)
def send(state: State, queue: str, batch: SendRequest) -> SendResult:
    """Send one batch in one transaction. A duplicate ignored by duplicate detection gets no
    sequence number."""
    messages = [m.to_message() for m in batch.messages]
    return SendResult(sequence_numbers=state.broker.sender(queue).send(messages))


@writes.post(
    "/queues/{queue:path}/deadletters/resubmit", summary="Resubmit dead-letters", status_code=202
)
def resubmit(state: State, queue: str, request: ResubmitRequest) -> TaskOut:
    """Start moving the matching dead-lettered messages back to their queue (or ``to``) at
    most ``rate`` per second, with a fresh delivery count and their failure history. The
    answer is the task: follow it at ``/api/tasks/{id}``, stop it with ``.../cancel``."""
    if request.to is not None:
        state.broker.get_queue(request.to)  # an unknown target first, as the broker says it
    where = _selecting(state, queue, request.where())
    record = state.start_resubmit(queue, to=request.to, rate=request.rate, where=where)
    return TaskOut(**task_json(record))


@writes.post(
    "/queues/{queue:path}/deadletters/purge", summary="Purge dead-letters", status_code=202
)
def purge(state: State, queue: str, filters: PurgeRequest) -> TaskOut:
    """Start dropping the matching dead-lettered messages (all of them with no filter),
    counted as dropped in the ledger. The answer is the task: follow it at
    ``/api/tasks/{id}``, stop it with ``.../cancel``."""
    where = _selecting(state, queue, filters.where())
    return TaskOut(**task_json(state.start_purge(queue, where)))


def _selecting(state: ServerState, queue: str, where: dict[str, Any]) -> dict[str, Any]:
    """``where``, if it selects a dead letter; else :class:`NothingSelectedError` (404),
    naming the groups there are by the field filtered on, as the command line does."""
    if state.broker.count_dead_letters(queue, **where):
        return where
    by = grouping_for(where)
    groups = state.broker.dead_letter_groups(queue, by)
    there = ", ".join(f"{group_label(g.key)} {g.count}" for g in groups)
    raise NothingSelectedError(queue, f"by {by}, there are {there}" if groups else "it has none")


@writes.post("/tasks/{task_id}/cancel", summary="Cancel a running task")
def cancel(state: State, task_id: int) -> TaskOut:
    """The task stops after its current chunk; what was moved stays moved."""
    return TaskOut(**task_json(state.cancel(task_id)))
