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

from poisonq.model import ReceivedMessage
from poisonq.server.state import server_state


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


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """``template`` rendered with ``context``, the session's operator and CSRF value; never
    cached, so Back shows a page as it is now, not as it was."""
    session = server_state(request).auth.session(request)
    html = _templates.get_template(template).render(
        logged_in=session is not None,
        operator=session.operator if session else "",
        csrf=session.csrf if session else "",
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


def error_page(request: Request, status_code: int, title: str, detail: str) -> Response:
    return page(request, "error.html", status_code=status_code, title=title, detail=detail)
