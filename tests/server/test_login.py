"""Logging in: UI sessions (a random id in the cookie, the rest on the server, so a session
ends when it expires or logs out whatever the browser kept), and wrong tokens throttled per
client, in the login form and the API alike."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from poisonq import ManualClock
from poisonq.server.sessions import SESSION_COOKIE, SESSION_LIFETIME
from poisonq.server.throttle import LIMIT, Throttle, Throttled
from tests.server.conftest import AUTH, TOKEN
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


def test_the_throttle_answers_a_guessers_wrong_tokens_for_longer_each_round() -> None:
    clock = ManualClock()
    throttle = Throttle(clock)
    waits = []
    for _ in range(3):
        for _ in range(LIMIT):
            throttle.failed("10.0.0.1")  # each a 401
        with pytest.raises(Throttled) as refused:
            throttle.failed("10.0.0.1")
        throttle.failed("10.0.0.2")  # another client's wrong token is a 401
        waits.append(refused.value.retry_after)
        clock.advance(refused.value.retry_after)
    assert waits == [60, 120, 240]


def test_wrong_tokens_sent_while_refused_lengthen_the_refusal() -> None:
    """A guesser that ignores Retry-After is refused for longer, up to an hour."""
    clock = ManualClock()
    throttle = Throttle(clock)
    for _ in range(LIMIT):
        throttle.failed("10.0.0.1")
    waits = []
    for _ in range(12 * LIMIT):
        with pytest.raises(Throttled) as refused:
            throttle.failed("10.0.0.1")
        waits.append(refused.value.retry_after)
    assert waits[:LIMIT] == [60] * (LIMIT - 1) + [120]
    assert max(waits) == 3600


def test_wrong_tokens_spread_out_are_not_throttled() -> None:
    clock = ManualClock()
    throttle = Throttle(clock)
    for _ in range(3 * LIMIT):
        throttle.failed("10.0.0.1")
        clock.advance(60 / (LIMIT - 1) + 0.1)  # LIMIT - 1 a minute


def test_the_login_form_throttles_wrong_tokens_and_keeps_the_name(
    client: TestClient, queue: str
) -> None:
    wrong = {"token": "guess", "operator": OPERATOR, "next": "/ui/"}
    for _ in range(LIMIT):
        assert client.post("/ui/login", data=wrong).status_code == 401
    refused = client.post("/ui/login", data=wrong, follow_redirects=False)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "60"
    assert 'role="alert">Too many wrong tokens: try again in 60 s.' in refused.text
    assert f'value="{OPERATOR}"' in refused.text
    right = {**wrong, "token": TOKEN}
    assert client.post("/ui/login", data=right, follow_redirects=False).status_code == 303


def test_the_right_token_works_after_any_number_of_wrong_ones_which_stay_throttled(
    app: FastAPI, queue: str
) -> None:
    """Someone else's guesses from the same address (127.0.0.1; everyone behind a proxy)
    cannot lock out Prometheus, a script or an operator: only wrong tokens are refused, and
    the right one does not wipe the guesser's record either."""
    guess = {"Authorization": "Bearer guess-guess-guess-guess"}
    with TestClient(app) as client:
        answers = [client.get("/api/queues/orders/counts", headers=guess) for _ in range(30)]
        assert [a.status_code for a in answers] == [401] * LIMIT + [429] * (30 - LIMIT)
        assert answers[-1].json()["error"] == "Throttled"
        assert int(answers[-1].headers["retry-after"]) > 60  # lengthened by the guessing
        assert client.get("/metrics", headers=AUTH).status_code == 200
        assert client.get("/api/queues/orders/counts", headers=AUTH).status_code == 200
        form = {"token": TOKEN, "operator": OPERATOR, "next": "/ui/"}
        assert client.post("/ui/login", data=form, follow_redirects=False).status_code == 303
        assert client.get("/api/queues/orders/counts", headers=guess).status_code == 429


def test_the_api_does_not_count_a_missing_token_as_a_guess(app: FastAPI, queue: str) -> None:
    with TestClient(app) as client:
        for _ in range(3 * LIMIT):
            assert client.get("/api/queues/orders/counts").status_code == 401
        guess = {"Authorization": "Bearer guess"}
        assert client.get("/api/queues/orders/counts", headers=guess).status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "https://testserver"},  # another scheme is another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://testserver"},
    ],
)
def test_a_login_from_another_origin_is_refused_before_its_token_is_looked_at(
    client: TestClient, queue: str, headers: dict[str, str]
) -> None:
    """A page an operator opens can neither log them in nor count wrong tokens against
    their address."""
    wrong = {"token": "guess", "operator": OPERATOR, "next": "/ui/"}
    for _ in range(3 * LIMIT):
        refused = client.post("/ui/login", data=wrong, headers=headers)
        assert refused.status_code == 403 and "another site" in refused.text
    right = {**wrong, "token": TOKEN}
    answer = client.post("/ui/login", data=right, headers=headers, follow_redirects=False)
    assert answer.status_code == 403 and SESSION_COOKIE not in client.cookies
    assert client.post("/ui/login", data=wrong).status_code == 401  # nothing was counted
    own = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}  # as Chromium sends them here
    assert (
        client.post("/ui/login", data=right, headers=own, follow_redirects=False).status_code == 303
    )


def test_a_get_of_logout_is_a_page_with_the_button_not_an_error(
    client: TestClient, queue: str
) -> None:
    """Logging out stays a POST (with the CSRF value); a typed /ui/logout is its page."""
    answer = client.get("/ui/logout", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    csrf = login(client)
    shown = client.get("/ui/logout", follow_redirects=False)
    assert shown.status_code == 200 and shown.headers["content-type"].startswith("text/html")
    assert f"logged in as <strong>{OPERATOR}</strong>" in shown.text
    assert '<form method="post" action="/ui/logout">' in shown.text
    assert f'name="csrf" value="{csrf}"' in shown.text
    assert client.get("/ui/", follow_redirects=False).status_code == 200  # still logged in
