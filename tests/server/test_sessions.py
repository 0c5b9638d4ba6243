"""UI sessions: a random id in the cookie, the rest on the server, so a session ends when it
expires or logs out whatever the browser kept."""

from __future__ import annotations

from fastapi.testclient import TestClient

from poisonq import ManualClock
from poisonq.server.sessions import SESSION_COOKIE, SESSION_LIFETIME
from tests.server.conftest import TOKEN
from tests.server.test_ui import OPERATOR, login


def test_each_login_gets_a_random_session_of_its_own(client: TestClient, queue: str) -> None:
    login(client)
    first = client.cookies[SESSION_COOKIE]
    client.cookies.clear()
    login(client)
    second = client.cookies[SESSION_COOKIE]
    assert first != second and TOKEN not in first + second
    client.cookies.set(SESSION_COOKIE, first)
    assert client.get("/ui/", follow_redirects=False).status_code == 200  # both stay open


def test_logout_ends_the_session_even_with_the_cookie_kept(client: TestClient, queue: str) -> None:
    csrf = login(client)
    kept = client.cookies[SESSION_COOKIE]
    assert client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    client.cookies.set(SESSION_COOKIE, kept)  # a copy of the cookie, replayed
    answer = client.get("/ui/", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login")
    assert client.post("/ui/purge", data={"csrf": csrf, "queue": "orders"}).status_code == 401


def test_a_session_expires(client: TestClient, clock: ManualClock, queue: str) -> None:
    login(client)
    cookie = client.cookies[SESSION_COOKIE]
    clock.advance(SESSION_LIFETIME - 60)
    assert client.get("/ui/", follow_redirects=False).status_code == 200
    clock.advance(61)
    client.cookies.set(SESSION_COOKIE, cookie)
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_the_cookie_ends_with_the_session(client: TestClient, queue: str) -> None:
    form = {"token": TOKEN, "operator": OPERATOR, "next": "/ui/"}
    cookie = client.post("/ui/login", data=form, follow_redirects=False).headers["set-cookie"]
    assert f"Max-Age={int(SESSION_LIFETIME)}" in cookie


def test_the_header_shows_who_is_logged_in(client: TestClient, queue: str) -> None:
    login(client)
    assert (
        f'id="operator" title="logged in: can change">{OPERATOR}</span>' in client.get("/ui/").text
    )


def test_a_login_needs_a_name(client: TestClient, queue: str) -> None:
    answer = client.post("/ui/login", data={"token": TOKEN, "operator": "  ", "next": "/ui/"})
    assert answer.status_code == 401 and "Give your name" in answer.text
    assert SESSION_COOKIE not in client.cookies
