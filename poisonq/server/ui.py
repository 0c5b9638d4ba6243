"""The web UI: a queue overview, the dead-letter explorer, message pages, resubmit/purge
with a confirmation step, every task and who started it, the pipelines' timelines, and the
store's ledger (the audit).
Server-rendered HTML with no JavaScript at all, so the Content-Security-Policy can forbid
every script.

A selection is a filter (a group's reason, subject or fingerprint, a sequence range, or one
message), so what the confirmation counts is exactly what the task takes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response

from poisonq.client import NO_VALUE, NoValue, group_label
from poisonq.errors import (
    EntityNotFoundError,
    InvalidNameError,
    InvalidOptionError,
    TaskRunningError,
)
from poisonq.history import WINDOWS
from poisonq.model import HELD_STATES, LIVE_STATES, SubQueue
from poisonq.names import parse_address
from poisonq.reports import StatusEvent
from poisonq.server.charts import GroupChart, bars, group_chart, sparkline
from poisonq.server.listing import newest_dead_letters
from poisonq.server.login import Form, Reader, Writer
from poisonq.server.pages import body_view, page
from poisonq.server.selection import Selection, selection
from poisonq.server.state import ServerState, server_state
from poisonq.server.timeline_chart import timeline_chart
from poisonq.store.base import DeadLetterCause, DeadLetterGroup
from poisonq.timeline import PipelineSummary

State = Annotated[ServerState, Depends(server_state)]
NonNegative = Annotated[int, Query(ge=0)]
PAGE = 50
TASK_REFRESH = 2  # seconds between reloads of a running task's progress frame
TASKS_PER_PAGE = 50
DEFAULT_WINDOW = "day"  # the explorer's chart, unless the operator picks another

router = APIRouter(prefix="/ui", include_in_schema=False)


# Reads ------------------------------------------------------------------------------------
@router.get("/", dependencies=[Reader])
def overview(request: Request, state: State) -> Response:
    """Every queue's depths now, and its depth and dead-letterings over the last day."""
    by_queue: dict[str, dict[str, Any]] = {}
    for info in state.broker.entities():
        address = parse_address(info.name)
        row = by_queue.setdefault(address.entity, {"subqueues": {}, "dropped": 0})
        # A queue's drops include its subqueues' (a purge drops dead letters).
        row["dropped"] += info.counts["dropped"]
        if address.subqueue is None:
            row["info"] = info
            event = StatusEvent.from_text(info.status_cause, state.broker.clock.now())
            row["cause"] = event.description if event else ""
        else:
            row["subqueues"][address.subqueue.value] = sum(info.counts[s] for s in HELD_STATES)
    queues = [{"name": name, **row} for name, row in by_queue.items() if "info" in row]
    totals = {
        "queues": len(queues),
        "held": sum(sum(q["info"].counts[s] for s in LIVE_STATES) for q in queues),
        "dead_lettered": sum(q["subqueues"].get(SubQueue.DEADLETTER.value, 0) for q in queues),
    }
    totals["pipelines"] = len(state.broker.pipelines())
    return page(
        request,
        "overview.html",
        queues=queues,
        totals=totals,
        trends=state.broker.queue_trends(),
        sparkline=sparkline,
        bars=bars,
    )


def _chart(
    state: ServerState, queue: str, by: str, name: str, names: dict[str | None, str]
) -> tuple[GroupChart | None, str | None]:
    """The explorer's chart of ``queue`` by ``by`` over the window ``name`` (keys shown by
    ``names`` where given), or why there is none: the window's name is not one there is."""
    try:
        timeline = state.broker.dead_letter_timeline(queue, by, name)
    except InvalidOptionError as exc:
        return None, str(exc)
    return group_chart(timeline, names), None


def _fingerprint_names(
    groups: list[DeadLetterGroup], labels: dict[str, tuple[str | None, str | None]]
) -> dict[str | None, str]:
    """How the chart names each fingerprint: its error type and key ("KeyError · 3fa2…"),
    the group without one "(none)" as in the table. A fingerprint no dead letter holds any more
    (resubmitted or purged) is named by the error type the store kept for it (``labels``)."""
    names: dict[str | None, str] = {
        key: f"{kind} · {key}" if kind else key for key, (kind, _) in labels.items()
    }
    for g in groups:
        names[g.key] = f"{g.label} · {g.key}" if g.label and g.key else group_label(g.key)
    return names


def _group_value(key: str | None) -> str | NoValue:
    """What selects exactly a group: its key, or :data:`NO_VALUE` for the ``(none)`` group
    (the messages without a value)."""
    return NO_VALUE if key is None else key


@router.get("/deadletters", dependencies=[Reader])
def explorer(
    request: Request,
    state: State,
    queue: str,
    by: str = "reason",
    order: str = "oldest",
    after: NonNegative = 0,
    before: NonNegative | None = None,
    window: str = DEFAULT_WINDOW,
) -> Response:
    """The dead-letterings over a window (a chart by the grouping, a sparkline per group),
    the groups (with the causes each reason hides), the selection, and its messages a page
    at a time, oldest first (paging up with ``after``) or newest first (paging down with
    ``before``). A filter or window that does not parse comes back on the page with why
    (a 400), and selects or draws nothing."""
    if order not in ("oldest", "newest"):
        raise InvalidOptionError("order must be oldest or newest")
    typed = dict(request.query_params)
    groups = state.broker.dead_letter_groups(queue, by)
    names = {}
    if by == "fingerprint":
        names = _fingerprint_names(groups, state.broker.dead_letter_fingerprints(queue))
    chart, bad_window = _chart(state, queue, by, window, names)
    causes: dict[str | None, list[DeadLetterCause]] = defaultdict(list)
    if by == "reason":
        for cause in state.broker.dead_letter_causes(queue):
            causes[cause.reason].append(cause)
    invalid, messages, matching = None, [], 0
    try:  # a filter that does not parse, or that the broker refuses (an empty time range)
        chosen = selection(typed)
        matching = state.broker.count_dead_letters(queue, **chosen.where)
    except InvalidOptionError as exc:
        invalid, chosen = str(exc), Selection({}, {})
    where = chosen.where
    if invalid is None:
        if order == "newest":
            messages = newest_dead_letters(state.broker, queue, before, PAGE, where)
        else:
            messages = state.broker.dead_letters(queue, after=after, limit=PAGE, **where)
    kept = {"order": order} if order == "newest" else {}
    if window != DEFAULT_WINDOW and bad_window is None:
        kept["window"] = window
    base = {"queue": queue, "by": by, **kept, **chosen.given}
    next_page = None
    if len(messages) == PAGE:
        onward = "before" if order == "newest" else "after"
        next_page = f"?{urlencode({**base, onward: messages[-1].sequence_number})}"
    return page(
        request,
        "explorer.html",
        200 if invalid is None and bad_window is None else 400,
        typed=typed,
        invalid=invalid,
        bad_window=bad_window,
        kept=kept,
        chart=chart,
        window=window,
        windows=WINDOWS,
        window_link=lambda name: "?" + urlencode({**base, "window": name}),
        causes=causes,
        queue=queue,
        by=by,
        order=order,
        groups=groups,
        messages=messages,
        chosen=chosen,
        matching=matching,
        selected=where.get(by),
        group_value=_group_value,
        group_link=lambda key: (
            "?" + urlencode({"queue": queue, "by": by, **kept, by: _group_value(key)})
        ),
        tab_link=lambda key: "?" + urlencode({"queue": queue, "by": key, **kept}),
        order_link=lambda key: "?" + urlencode({**base, "order": key}),
        actions={
            a: "confirm?" + urlencode({"queue": queue, "action": a, **chosen.given})
            for a in ("resubmit", "purge")
        },
        message_link=lambda seq: (
            "message?" + urlencode({"address": f"{queue}/$deadletterqueue", "seq": seq})
        ),
        next_page=next_page,
    )


@router.get("/message", dependencies=[Reader])
def message_page(request: Request, state: State, address: str, seq: int) -> Response:
    message = state.broker.message(address, seq)
    parsed = parse_address(address)
    kind, body = body_view(message.body)
    actions = {}
    if parsed.subqueue is SubQueue.DEADLETTER:
        one = {"queue": parsed.entity, "min_sequence": seq, "max_sequence": seq}
        actions = {a: "confirm?" + urlencode({**one, "action": a}) for a in ("resubmit", "purge")}
    return page(
        request,
        "message.html",
        address=address,
        queue=parsed.entity,
        message=message,
        body_kind=kind,
        body=body,
        actions=actions,
    )


def _confirm_page(
    request: Request,
    state: State,
    queue: str,
    action: str,
    chosen: Selection,
    status_code: int = 200,
    **notes: Any,
) -> Response:
    """How many messages the action would take, and the form that takes them. ``notes``
    say why nothing happened when the form came back: ``refused`` (a purge of a whole
    dead-letter queue needs the number typed; this is what was typed instead), ``busy``
    (a task of this server runs on the queue: no button then), ``invalid`` (a value the
    broker refused, shown with the form as it was filled in, ``given``)."""
    count = state.broker.count_dead_letters(queue, **chosen.where)
    shown: dict[str, Any] = {"refused": None, "busy": None, "invalid": None, "given": {}}
    shown.update(notes)
    if shown["busy"] is None and (running := state.running(queue)) is not None:
        shown["busy"] = TaskRunningError(queue, running.id)
    context = {"queue": queue, "action": action, "chosen": chosen, "count": count, **shown}
    return page(request, "confirm.html", status_code, **context)


@router.get("/confirm", dependencies=[Reader])
def confirm(request: Request, state: State, queue: str, action: str) -> Response:
    if action not in ("resubmit", "purge"):
        raise InvalidOptionError("action must be resubmit or purge")
    return _confirm_page(request, state, queue, action, selection(dict(request.query_params)))


@router.get("/tasks", dependencies=[Reader])
def tasks_page(
    request: Request,
    state: State,
    id: NonNegative | None = None,
    queue: str = "",
    before: NonNegative | None = None,
) -> Response:
    """Every resubmit and purge, newest first, whichever process ran it: who started and
    who cancelled each, what it selected, how far it got (of one queue with ``queue``)."""
    if id is not None:
        return RedirectResponse(f"/ui/tasks/{id}", 303)
    chosen = state.broker.tasks(queue or None, before=before, limit=TASKS_PER_PAGE + 1)
    older = chosen[TASKS_PER_PAGE].id + 1 if len(chosen) > TASKS_PER_PAGE else None
    listed = [(task, parse_address(task.entity).entity) for task in chosen[:TASKS_PER_PAGE]]
    return page(request, "tasks.html", tasks=listed, queue=queue, older=older)


@router.get("/tasks/{task_id}", dependencies=[Reader])
def task_page(
    request: Request, state: State, task_id: int, queue: str = "", follow: bool = True
) -> Response:
    """A task's progress; while the task runs (and ``follow`` is on), in a frame that
    reloads itself, so the page with Cancel does not move under the keyboard."""
    record = state.broker.task(task_id)
    return page(request, "task.html", task=record, queue=queue, follow=follow, refresh=TASK_REFRESH)


@router.get("/tasks/{task_id}/progress", dependencies=[Reader])
def task_progress(request: Request, state: State, task_id: int, queue: str = "") -> Response:
    """The progress frame of a task's page: reloads itself while the task runs, by the
    ``Refresh`` header (no script; the page around it says so and has "Stop reloading"
    before the frame, which is what WCAG 2.2.1 asks of a timed refresh)."""
    record = state.broker.task(task_id)
    answer = page(request, "task_progress.html", task=record, queue=queue)
    if record.status == "running":
        answer.headers["Refresh"] = str(TASK_REFRESH)
    return answer


# The ledger -------------------------------------------------------------------------------
@router.get("/audit", dependencies=[Reader])
def audit_page(request: Request, state: State) -> Response:
    """The store's ledger (:meth:`Broker.audit`): each entity's sent and moved in against
    what was completed, dropped, moved out or is held, and whether every one balances, so
    an operator can confirm it without the command line."""
    return page(request, "audit.html", report=state.broker.audit())


# Pipelines --------------------------------------------------------------------------------
def _pipeline_link(summary: PipelineSummary) -> str:
    return "/ui/pipeline?" + urlencode({"consumer": summary.consumer, "queue": summary.queue})


@router.get("/pipelines", dependencies=[Reader])
def pipelines_page(request: Request, state: State) -> Response:
    """Every pipeline consumer with a timeline, with its last batch."""
    return page(request, "pipelines.html", pipelines=state.broker.pipelines(), link=_pipeline_link)


@router.get("/pipeline", dependencies=[Reader])
def pipeline_page(
    request: Request, state: State, consumer: str, queue: str | None = None
) -> Response:
    """A consumer's timeline as a chart of every batch kept, and its newest batches."""
    batches = state.broker.pipeline_batches(consumer, queue)
    newest = batches[::-1][:PAGE]
    return page(
        request,
        "pipeline.html",
        consumer=consumer,
        queue=batches[0].queue,
        batches=batches,
        newest=newest,
        shown=len(newest),
        chart=timeline_chart(batches),
    )


# Writes -----------------------------------------------------------------------------------
def _to_task(task_id: int, queue: str) -> Response:
    """After a change, the task's page (post, redirect, get: a reload does not repeat it)."""
    return RedirectResponse(f"/ui/tasks/{task_id}?{urlencode({'queue': queue})}", 303)


@router.post("/resubmit")
def resubmit(request: Request, state: State, session: Writer, form: Form) -> Response:
    """Start the resubmit; a rate or target queue the broker refuses brings the confirmation
    back as it was filled in, with why."""
    queue = form.get("queue", "")
    chosen = selection(form)
    given = {name: form.get(name, "").strip() for name in ("rate", "to")}
    try:
        try:
            rate = float(given["rate"] or 0) or None  # 0 or empty: no limit, as the CLI's
        except ValueError:
            raise InvalidOptionError("rate must be a number of messages per second") from None
        record = state.start_resubmit(
            queue, to=given["to"] or None, rate=rate, where=chosen.where, operator=session.operator
        )
    except TaskRunningError as busy:
        return _confirm_page(request, state, queue, "resubmit", chosen, 409, busy=busy, given=given)
    except (InvalidOptionError, InvalidNameError, EntityNotFoundError) as exc:
        return _confirm_page(
            request, state, queue, "resubmit", chosen, 400, invalid=str(exc), given=given
        )
    return _to_task(record.id, queue)


@router.post("/purge")
def purge(request: Request, state: State, session: Writer, form: Form) -> Response:
    """Drop the selection; a purge with no filter drops only if the number typed is the
    number of dead letters there are now (else the confirmation again, with why)."""
    queue = form.get("queue", "")
    chosen = selection(form)
    if not chosen.given:
        typed = form.get("count", "").strip()
        # As the page shows it (1,600) or as typed (1600).
        if typed.replace(",", "").replace(" ", "") != str(state.broker.count_dead_letters(queue)):
            return _confirm_page(request, state, queue, "purge", chosen, 400, refused=typed)
    try:
        record = state.start_purge(queue, chosen.where, operator=session.operator)
    except TaskRunningError as busy:
        return _confirm_page(request, state, queue, "purge", chosen, 409, busy=busy)
    return _to_task(record.id, queue)


@router.post("/tasks/{task_id}/cancel")
def cancel(state: State, task_id: int, session: Writer, form: Form) -> Response:
    state.cancel(task_id, session.operator)
    return _to_task(task_id, form.get("queue", ""))
