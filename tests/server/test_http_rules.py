"""Rules every route keeps, whatever it serves: HEAD where GET is, the OpenAPI document read
like the API, no copy of an API answer kept by a browser or proxy, and bodies within their
limits before any route (or the token) is looked at."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from poisonq import Broker
from poisonq.server import create_app
from poisonq.server.guard import RequestLimits
from poisonq.server.throttle import LIMIT
from tests.helpers import assert_balanced
from tests.server.conftest import AUTH, TOKEN
from tests.server.test_ui import login


@pytest.mark.parametrize(
    "path", ["/ui/", "/ui/login", "/ui/tasks", "/metrics", "/api/entities", "/ui/static/style.css"]
)
def test_head_is_answered_wherever_get_is(open_client: TestClient, queue: str, path: str) -> None:
    """Uptime checks use HEAD: the status and headers of GET, no body."""
    got = open_client.get(path, headers=AUTH)
    head = open_client.head(path, headers=AUTH)
    assert (head.status_code, got.status_code) == (200, 200)
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_needs_what_get_needs(client: TestClient, queue: str) -> None:
    assert client.head("/api/entities").status_code == 401
    assert client.head("/ui/", follow_redirects=False).status_code == 303


def test_the_openapi_document_is_read_like_the_api(
    client: TestClient, open_client: TestClient
) -> None:
    assert client.get("/api/openapi.json").status_code == 401
    assert client.get("/api/openapi.json", headers=AUTH).json()["openapi"].startswith("3.")
    assert open_client.get("/api/openapi.json").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/entities",
        "/api/queues/orders/deadletters?reason=InvalidOrder",
        "/api/queues/orders/messages/1?subqueue=deadletter",
        "/api/queues/nowhere/counts",  # an error too
        "/metrics",
        "/api/openapi.json",
    ],
)
def test_api_answers_are_not_kept_by_browsers_or_proxies(
    client: TestClient, dead: dict[str, list[int]], path: str
) -> None:
    """They carry message bodies, properties and counts."""
    assert client.get(path, headers=AUTH).headers["cache-control"] == "no-store"
    assert client.get(path).headers["cache-control"] == "no-store"  # the 401 too


def test_a_form_past_its_limit_is_refused_before_the_session_is_looked_at(
    client: TestClient, queue: str
) -> None:
    csrf = login(client)
    body = {"csrf": csrf, "queue": "orders", "reason": "x" * RequestLimits().form_bytes}
    refused = client.post("/ui/purge", data=body)
    assert refused.status_code == 413 and refused.json()["error"] == "RequestTooLarge"
    assert refused.headers["connection"] == "close"


def test_an_api_send_with_the_token_has_its_own_limit_the_server_sets(
    broker: Broker, queue: str
) -> None:
    """Without the right token a send's body may be no larger than a form's, so clients
    nobody knows cannot make the server hold 8 MiB each."""
    limits = RequestLimits(send_bytes=200_000)
    with TestClient(create_app(broker, token=TOKEN, limits=limits)) as client:
        fits = {"messages": [{"body": "x" * 150_000}]}
        sent = client.post("/api/queues/orders/messages", json=fits, headers=AUTH)
        assert sent.status_code == 201
        for token in ({"Authorization": "Bearer wrong"}, {}):  # only the form's limit
            refused = client.post("/api/queues/orders/messages", json=fits, headers=token)
            assert refused.status_code == 413
        past = json.dumps({"messages": [{"body": "x" * 200_000}]})
        for token in (AUTH, {"Authorization": "Bearer wrong"}, {}):
            refused = client.post(
                "/api/queues/orders/messages",
                content=past,
                headers={**token, "Content-Type": "application/json"},
            )
            assert refused.status_code == 413  # the token is never looked at
        other = client.post(  # the send's limit is for sends only
            "/api/queues/orders/deadletters/purge",
            content=json.dumps({"reason": "x" * 100_000}),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert other.status_code == 413
    assert broker.counts(queue)["active"] == 1
    assert_balanced(broker)


def test_a_wrong_token_refused_for_its_body_still_counts_as_a_guess(
    broker: Broker, queue: str
) -> None:
    """A send's limit is larger with the right token, so a 413 says the token was wrong:
    that answer is counted like a 401, and throttled like one."""
    limits = RequestLimits(send_bytes=200_000)
    batch = {"messages": [{"body": "x" * 100_000}]}  # past a form's limit, within a send's
    guess = {"Authorization": "Bearer guess-guess-guess-guess"}
    with TestClient(create_app(broker, token=TOKEN, limits=limits)) as client:
        answers = [
            client.post("/api/queues/orders/messages", json=batch, headers=guess).status_code
            for _ in range(LIMIT + 2)
        ]
        assert answers == [413] * LIMIT + [429] * 2
        assert client.get("/api/queues/orders/counts", headers=guess).status_code == 429
        sent = client.post("/api/queues/orders/messages", json=batch, headers=AUTH)
        assert sent.status_code == 201
    assert_balanced(broker)
