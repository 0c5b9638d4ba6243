"""How the web UI renders a page: the Jinja2 templates, their filters, and what every page
knows about the session (who is logged in, the CSRF value its forms carry).

Message bodies, properties and error texts are untrusted: they reach the page only through
Jinja2 with autoescaping on for every template, so ``<script>`` in a body is shown as text.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader

from poisonq.client import group_label
from poisonq.model import ReceivedMessage
from poisonq.server.charts import HEIGHT, SPARK_HEIGHT, SPARK_WIDTH, WIDTH
from poisonq.server.state import server_state
from poisonq.timeline import per_second


def _utc(value: datetime | float) -> datetime:
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC)


def _time(value: datetime | float | None) -> str:
    return "" if value is None else _utc(value).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(value: datetime | float) -> str:
    """For ``<time datetime=...>``."""
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: datetime | float) -> float:
    return value.timestamp() if isinstance(value, datetime) else value


def ago(value: datetime | float | None, now: float) -> str:
    """``value`` relative to ``now`` the way an operator reads a listing: "42 s ago",
    "5 min ago", "3 h ago", "12 d ago" (or "in 5 min" for a time to come); the exact time
    goes in the element's title."""
    if value is None:
        return ""
    seconds = now - _epoch(value)
    future, seconds = seconds < 0, abs(seconds)
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            amount = f"{int(seconds // span)} {unit}"
            break
    else:
        amount = f"{int(seconds)} s"
    return f"in {amount}" if future else f"{amount} ago"


def size(count: int) -> str:
    """A number of bytes as people read it: 312 bytes, 1.2 KiB, 3.4 MiB."""
    if count < 1024:
        return f"{count} bytes"
    amount = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        amount /= 1024
        if amount < 1024 or unit == "GiB":
            break
    return f"{amount:.1f} {unit}"


def count(value: int) -> str:
    """A count with thousands separators (800,716): read at a glance, never misread."""
    return f"{value:,}"


def _preview(message: ReceivedMessage, width: int = 48) -> str:
    """The start of a body, its white space folded; a body that is not UTF-8 text is
    "binary" and its size, not a row of replacement characters. Short: the listing shows it
    whole, wrapped in its column (the body is on the message's page)."""
    try:
        text = " ".join(message.body.decode("utf-8").split())
    except UnicodeDecodeError:
        return f"binary, {size(len(message.body))}"
    return text if len(text) <= width else text[: width - 1] + "…"


def _short_type(error_type: str) -> str:
    """``KeyError`` for ``KeyError``, ``UpstreamTimeout`` for ``shop.pay.UpstreamTimeout``."""
    return error_type.rpartition(".")[2]


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
_templates.filters["iso"] = _iso
_templates.filters["preview"] = _preview
_templates.filters["ago"] = ago
_templates.filters["size"] = size
_templates.filters["count"] = count
_templates.filters["group_label"] = group_label
_templates.filters["short_type"] = _short_type
_templates.filters["per_second"] = per_second
_templates.globals.update(
    width=WIDTH, height=HEIGHT, spark_width=SPARK_WIDTH, spark_height=SPARK_HEIGHT
)


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


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """``template`` rendered with ``context``, the session's operator and CSRF value, and
    ``now`` on the broker's clock (for relative times); never cached, so Back shows a page
    as it is now, not as it was."""
    state = server_state(request)
    session = state.auth.session(request)
    html = _templates.get_template(template).render(
        now=state.broker.clock.now(),
        logged_in=session is not None,
        operator=session.operator if session else "",
        csrf=session.csrf if session else "",
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


def error_page(
    request: Request, status_code: int, title: str, detail: str, kind: str = ""
) -> Response:
    """A page that says what went wrong: ``title`` for people, ``kind`` the error's type."""
    return page(request, "error.html", status_code, title=title, detail=detail, kind=kind)
