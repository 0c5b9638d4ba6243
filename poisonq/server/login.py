"""Logging in to the web UI, logging out, and what UI routes require of a session.

Login checks the token once and opens a server-side session (:mod:`poisonq.server.sessions`)
for the operator's name; the cookie holds only the session's random id. A login posted from a
page of another origin is refused before its token is looked at (:func:`same_origin`): a page
an operator opens cannot log them in, nor count wrong tokens against their address.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from poisonq.limits import MAX_OPERATOR
from poisonq.server.pages import error_page, page
from poisonq.server.sessions import SESSION_COOKIE, Session
from poisonq.server.state import ServerState, server_state
from poisonq.server.throttle import Throttled

State = Annotated[ServerState, Depends(server_state)]
router = APIRouter(prefix="/ui", include_in_schema=False)


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the UI's only kind of form)."""
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace")))


Form = Annotated[dict[str, str], Depends(_form)]


class LoginNeeded(Exception):
    """A read page was asked for without a session while reads are not open."""

    def __init__(self, target: str) -> None:
        self.target = target


def _reader(request: Request) -> None:
    auth = server_state(request).auth
    if not auth.open_reads and auth.session(request) is None:
        raise LoginNeeded(request.url.path + (f"?{request.url.query}" if request.url.query else ""))


class Unauthorized(Exception):
    """A change was posted without a valid session and CSRF value: ``logged_in`` when the
    session was valid and the form's CSRF value was not (a form from before a restart or
    another login, kept in a tab)."""

    def __init__(self, logged_in: bool) -> None:
        self.logged_in = logged_in


def _writer(request: Request, form: Form) -> Session:
    """A change needs an open session and its CSRF value in the form."""
    auth = server_state(request).auth
    session = auth.session(request)
    if session is None or not auth.csrf_ok(session, form.get("csrf", "")):
        raise Unauthorized(logged_in=session is not None)
    return session


Reader = Depends(_reader)
Writer = Annotated[Session, Depends(_writer)]


def _local(target: str) -> str:
    """Only a path of this UI may be a redirect target after login."""
    return target if target.startswith("/ui/") and not target.startswith("//") else "/ui/"


def same_origin(request: Request) -> bool:
    """Whether a browser says the request comes from this server's own pages. Browsers send
    ``Sec-Fetch-Site`` (Chromium since 2020, Firefox since 2021, Safari since 2023):
    ``same-origin`` from this server's pages. Without it, ``Origin`` must be this server's
    origin: this request's scheme (``https`` behind a proxy trusted for
    ``X-Forwarded-Proto``) and ``Host``. (Under this server's ``Referrer-Policy:
    no-referrer`` a browser sends ``Origin: null`` even from its own page, so ``null`` says
    nothing, and is refused only when nothing else speaks.) A request with neither header is
    from no browser, so no page made it."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
    return True


@router.get("/login")
def login_page(request: Request, next: str = "/ui/") -> Response:
    return page(request, "login.html", next=_local(next), error=None, given="")


@router.post("/login")
def login(request: Request, state: State, form: Form) -> Response:
    target = _local(form.get("next", "/ui/"))
    operator = " ".join(form.get("operator", "").split())[:MAX_OPERATOR]
    if not same_origin(request):
        why = "This login came from a page of another site: log in from this server's own page."
        return error_page(request, 403, "Login from another site", why)
    error, status, wait = None, 401, None
    try:
        if not state.auth.token_matches(request, form.get("token", "")):
            error = "That is not the token."
        elif not operator:
            error = "Give your name: the tasks you start show it."
    except Throttled as exc:
        error, status, wait = f"Too many wrong tokens: try again in {exc.retry_after} s.", 429, exc
    if error is not None:
        answer = page(request, "login.html", status, next=target, error=error, given=operator)
        if wait is not None:
            answer.headers["Retry-After"] = str(wait.retry_after)
        return answer
    response = RedirectResponse(target, 303)
    response.set_cookie(
        SESSION_COOKIE,
        state.auth.sessions.open(operator),
        max_age=int(state.auth.sessions.lifetime),
        httponly=True,
        secure=state.auth.secure_cookies or request.url.scheme == "https",
        samesite="lax",
        path="/",
    )
    return response


@router.get("/logout")
def logout_page(request: Request, state: State) -> Response:
    """A typed or bookmarked ``/ui/logout``: logging out stays a POST with the CSRF value (a
    link or an image on another site must not end a session), so this is the page with the
    button; with no session there is nothing to end, and it is the login page."""
    if state.auth.session(request) is None:
        return RedirectResponse("/ui/login", 303)
    return page(request, "logout.html")


@router.post("/logout")
def logout(request: Request, state: State, _: Writer) -> Response:
    state.auth.sessions.close(request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/ui/", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def login_redirect(request: Request, exc: LoginNeeded) -> Response:
    return RedirectResponse("/ui/login?" + urlencode({"next": exc.target}), 303)


def unauthorized_page(request: Request, exc: Unauthorized) -> Response:
    if exc.logged_in:
        why = "This form is from an earlier session: nothing was changed. Reload the page."
        return error_page(request, 403, "Form expired", why)
    return error_page(request, 401, "Log in first", "Changes need the token: log in and try again.")
