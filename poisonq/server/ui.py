"""The web UI: a queue overview, the dead-letter explorer, message pages, and resubmit/purge
with a confirmation step. Server-rendered HTML with no JavaScript at all, so the
Content-Security-Policy can forbid every script.

Message bodies, properties and error texts are untrusted: they reach the page only through
Jinja2 with autoescaping on for every template, so ``<script>`` in a body is shown as text.
A selection is a filter (a group's reason, subject or fingerprint, a sequence range, or one
message), so what the confirmation counts is exactly what the task takes.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader

from poisonq.client import spelled_filters
from poisonq.errors import InvalidOptionError
from poisonq.model import ReceivedMessage, SubQueue
from poisonq.names import parse_address
from poisonq.server.auth import SESSION_COOKIE
from poisonq.server.state import ServerState, server_state
from poisonq.store.base import NO_VALUE, NoValue

State = Annotated[ServerState, Depends(server_state)]
NonNegative = Annotated[int, Query(ge=0)]
PAGE = 50
FILTERS = ("reason", "subject", "fingerprint", "min_sequence", "max_sequence")
_INT_FILTERS = ("min_sequence", "max_sequence")
_LIVE = ("active", "scheduled", "locked", "deferred")
_HELD = (*_LIVE, "dead_lettered")

router = APIRouter(prefix="/ui", include_in_schema=False)


def _time(value: datetime | float | None) -> str:
    if value is None:
        return ""
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _preview(message: ReceivedMessage, width: int = 80) -> str:
    text = " ".join(message.text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# autoescape=True for every template (not select_autoescape by file name): every value a
# template prints is HTML-escaped unless a template says otherwise, and none does.
_templates = Environment(
    loader=PackageLoader("poisonq.server", "templates"),
    autoescape=True,
    auto_reload=False,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["time"] = _time
_templates.filters["preview"] = _preview


def body_view(body: bytes) -> tuple[str, str]:
    """How to show a body: ("json", indented), ("text", as is) or ("binary", base64)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", base64.b64encode(body).decode()
    try:
        return "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return "text", text


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    state = server_state(request)
    logged_in = state.auth.session_ok(request)
    html = _templates.get_template(template).render(
        logged_in=logged_in,
        csrf=state.auth.csrf_value if logged_in else "",
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


def _filters(params: dict[str, str]) -> dict[str, Any]:
    """The dead-letter filters given (empty fields are not filters; ``none`` selects the
    messages without a value, as the ``(none)`` group's link does)."""
    where: dict[str, Any] = {}
    for name in FILTERS:
        value = params.get(name, "").strip()
        if value:
            if name in _INT_FILTERS:
                try:
                    where[name] = int(value)
                except ValueError:
                    raise InvalidOptionError(f"{name} must be a whole number") from None
            else:
                where[name] = value
    return spelled_filters(where)


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the UI's only kind of form)."""
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace")))


Form = Annotated[dict[str, str], Depends(_form)]


class LoginNeeded(Exception):
    """A read page was asked for without a session while reads are not open."""

    def __init__(self, target: str) -> None:
        self.target = target


def _reader(request: Request) -> None:
    state = server_state(request)
    if not state.auth.open_reads and not state.auth.session_ok(request):
        raise LoginNeeded(request.url.path + (f"?{request.url.query}" if request.url.query else ""))


class Unauthorized(Exception):
    """A change was posted without a valid session and CSRF value."""


def _writer(request: Request, form: Form) -> None:
    """A change needs the session cookie and the CSRF value in the form."""
    state = server_state(request)
    if not (state.auth.session_ok(request) and state.auth.csrf_ok(form.get("csrf", ""))):
        raise Unauthorized()


Reader = Depends(_reader)


def _local(target: str) -> str:
    """Only a path of this UI may be a redirect target after login."""
    return target if target.startswith("/ui/") and not target.startswith("//") else "/ui/"


# Reads ------------------------------------------------------------------------------------
@router.get("/", dependencies=[Reader])
def overview(request: Request, state: State) -> Response:
    by_queue: dict[str, dict[str, Any]] = {}
    for info in state.broker.entities():
        address = parse_address(info.name)
        row = by_queue.setdefault(address.entity, {"subqueues": {}})
        if address.subqueue is None:
            row["info"] = info
        else:
            row["subqueues"][address.subqueue.value] = sum(info.counts[s] for s in _HELD)
    queues = [{"name": name, **row} for name, row in by_queue.items() if "info" in row]
    totals = {
        "queues": len(queues),
        "held": sum(sum(q["info"].counts[s] for s in _LIVE) for q in queues),
        "dead_lettered": sum(q["subqueues"].get(SubQueue.DEADLETTER.value, 0) for q in queues),
    }
    return _page(request, "overview.html", queues=queues, totals=totals)


def _group_value(key: str | None) -> str | NoValue:
    """What selects exactly a group: its key, or :data:`NO_VALUE` for the ``(none)`` group
    (the messages without a value)."""
    return NO_VALUE if key is None else key


@router.get("/deadletters", dependencies=[Reader])
def explorer(
    request: Request, state: State, queue: str, by: str = "reason", after: NonNegative = 0
) -> Response:
    params = dict(request.query_params)
    where = _filters(params)
    groups = state.broker.dead_letter_groups(queue, by)
    messages = state.broker.dead_letters(queue, after=after, limit=PAGE, **where)
    matching = state.broker.count_dead_letters(queue, **where)
    base = {"queue": queue, "by": by, **where}
    next_page = (
        f"?{urlencode({**base, 'after': messages[-1].sequence_number})}"
        if len(messages) == PAGE
        else None
    )
    return _page(
        request,
        "explorer.html",
        queue=queue,
        by=by,
        groups=groups,
        messages=messages,
        where=where,
        matching=matching,
        selected=where.get(by),
        group_value=_group_value,
        group_link=lambda key: "?" + urlencode({"queue": queue, "by": by, by: _group_value(key)}),
        tab_link=lambda key: "?" + urlencode({"queue": queue, "by": key}),
        actions={
            a: "confirm?" + urlencode({"queue": queue, "action": a, **where})
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
    return _page(
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
    where: dict[str, Any],
    refused: str | None = None,
) -> Response:
    """How many messages the action would take, and the form that takes them. A purge of
    a whole dead-letter queue asks for that number to be typed (``count``); ``refused`` is
    what was typed instead, shown with why nothing was dropped."""
    count = state.broker.count_dead_letters(queue, **where)
    context = {"queue": queue, "action": action, "where": where, "count": count}
    status_code = 200 if refused is None else 400
    return _page(request, "confirm.html", status_code, refused=refused, **context)


@router.get("/confirm", dependencies=[Reader])
def confirm(request: Request, state: State, queue: str, action: str) -> Response:
    if action not in ("resubmit", "purge"):
        raise InvalidOptionError("action must be resubmit or purge")
    return _confirm_page(request, state, queue, action, _filters(dict(request.query_params)))


@router.get("/tasks/{task_id}", dependencies=[Reader])
def task_page(request: Request, state: State, task_id: int, queue: str = "") -> Response:
    """A task's progress; the page reloads itself (a meta refresh, not a script) while the
    task runs."""
    record = state.broker.task(task_id)
    return _page(request, "task.html", task=record, queue=queue)


# Writes -----------------------------------------------------------------------------------
Writer = Depends(_writer)


def _to_task(task_id: int, queue: str) -> Response:
    """After a change, the task's page (post, redirect, get: a reload does not repeat it)."""
    return RedirectResponse(f"/ui/tasks/{task_id}?{urlencode({'queue': queue})}", 303)


@router.post("/resubmit", dependencies=[Writer])
def resubmit(state: State, form: Form) -> Response:
    queue = form.get("queue", "")
    rate_text = form.get("rate", "").strip()
    try:
        rate = float(rate_text) if rate_text else None
    except ValueError:
        raise InvalidOptionError("rate must be a number of messages per second") from None
    to = form.get("to", "").strip() or None
    record = state.start_resubmit(queue, to=to, rate=rate, where=_filters(form))
    return _to_task(record.id, queue)


@router.post("/purge", dependencies=[Writer])
def purge(request: Request, state: State, form: Form) -> Response:
    """Drop the selection; a purge with no filter drops only if the number typed is the
    number of dead letters there are now (else the confirmation again, with why)."""
    queue = form.get("queue", "")
    where = _filters(form)
    if not where:
        typed = form.get("count", "").strip()
        if typed != str(state.broker.count_dead_letters(queue)):
            return _confirm_page(request, state, queue, "purge", where, refused=typed)
    record = state.purge(queue, where)
    return _to_task(record.id, queue)


@router.post("/tasks/{task_id}/cancel", dependencies=[Writer])
def cancel(state: State, task_id: int, form: Form) -> Response:
    state.broker.cancel_task(task_id)
    return _to_task(task_id, form.get("queue", ""))


# Login ------------------------------------------------------------------------------------
@router.get("/login")
def login_page(request: Request, next: str = "/ui/") -> Response:
    return _page(request, "login.html", next=_local(next), failed=False)


@router.post("/login")
def login(request: Request, state: State, form: Form) -> Response:
    target = _local(form.get("next", "/ui/"))
    if not state.auth.token_matches(form.get("token", "")):
        return _page(request, "login.html", status_code=401, next=target, failed=True)
    response = RedirectResponse(target, 303)
    response.set_cookie(
        SESSION_COOKIE, state.auth.session_value, httponly=True, samesite="strict", path="/"
    )
    return response


@router.post("/logout", dependencies=[Writer])
def logout() -> Response:
    response = RedirectResponse("/ui/", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def login_redirect(request: Request, exc: LoginNeeded) -> Response:
    return RedirectResponse("/ui/login?" + urlencode({"next": exc.target}), 303)


def unauthorized_page(request: Request, exc: Unauthorized) -> Response:
    return error_page(request, 401, "Log in first", "Changes need the token: log in and try again.")


def error_page(request: Request, status_code: int, title: str, detail: str) -> Response:
    return _page(request, "error.html", status_code=status_code, title=title, detail=detail)
