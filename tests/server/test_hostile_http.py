"""Hostile requests to the JSON API on both stores: paths, query parameters and JSON bodies
of every wrong kind are answered with a 4xx JSON error (never a 5xx), and the ledger
balances after every request (``tests/hostile.py``)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from httpx2 import Response
from hypothesis import given
from hypothesis import strategies as st

from poisonq import Broker
from tests.helpers import assert_balanced
from tests.hostile import HOSTILE, SPECIAL_TEXT, any_char, hostile_text
from tests.server.conftest import AUTH, wait_for_task

# The PostgreSQL pool opens connections in threads of its own while requests run, with a
# jitter from the ``random`` module, which hypothesis takes for a strategy using it.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module")


def encoded(text: str, safe: str = "") -> str:
    """``text`` percent-encoded as a client may send it: invalid UTF-8 (a lone surrogate
    encoded as it stands) among it."""
    return quote(text.encode("utf-8", "surrogatepass"), safe=safe)


segments = st.one_of(
    st.just("orders"),
    st.just("orders/$deadletterqueue"),
    (hostile_text | st.sampled_from(["%", "%zz", "orders;retry"])).map(
        lambda text: encoded(text, safe="/$;")
    ),
)
numbers = st.integers().map(str) | st.sampled_from(["1.5", "-1", "nan", "1e999", "", "0x10"])
query_values = numbers | st.text(any_char, max_size=30) | st.sampled_from(SPECIAL_TEXT)
queries = st.dictionaries(
    st.sampled_from(
        [
            *("subqueue", "from_sequence", "limit", "by", "after", "reason", "subject"),
            *("fingerprint", "min_sequence", "max_sequence", "since", "until"),
        ]
    )
    | st.text(max_size=5),
    query_values,
    max_size=4,
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**64, -(2**63) - 1, 10**400])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(any_char.filter(lambda c: not 0xD800 <= ord(c) <= 0xDFFF), max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
# Each field valid or not, so that a batch often reaches the broker with one bad value.
plain = st.text(max_size=10)
valid_fields: dict[str, st.SearchStrategy[Any]] = {
    "body": plain | st.sampled_from(["AAEC", "!!"]),
    "body_encoding": st.sampled_from(["utf-8", "base64", "latin-1"]),
    "message_id": plain,
    "content_type": plain,
    "subject": plain,
    "properties": st.dictionaries(plain, st.none() | st.booleans() | st.integers() | plain),
    "session_id": plain,
    "correlation_id": plain,
    "reply_to": plain,
    "time_to_live": st.floats(0, 1e12) | st.sampled_from([-1, 0, 1e300]),
    "scheduled_enqueue_time": st.sampled_from(["2030-01-01T00:00:00Z", "9999-12-31T23:59:59"]),
}
message_fields = st.fixed_dictionaries(
    {},
    optional={name: st.one_of(valid, valid, json_values) for name, valid in valid_fields.items()},
)
batches = st.fixed_dictionaries({"messages": st.lists(message_fields, min_size=1, max_size=3)})
send_bodies = st.one_of(batches, batches, json_values)
task_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            name: json_values | query_values
            for name in ("to", "rate", "reason", "subject", "min_sequence", "since", "until")
        },
    )
    | json_values
)
routes = st.sampled_from(
    [
        ("GET", "/api/queues/{q}/counts"),
        ("GET", "/api/queues/{q}/messages"),
        ("GET", "/api/queues/{q}/messages/{n}"),
        ("GET", "/api/queues/{q}/deadletters/groups"),
        ("GET", "/api/queues/{q}/deadletters"),
        ("GET", "/api/tasks/{n}"),
        ("POST", "/api/queues/{q}/messages"),
        ("POST", "/api/queues/{q}/deadletters/resubmit"),
        ("POST", "/api/queues/{q}/deadletters/purge"),
        ("POST", "/api/tasks/{n}/cancel"),
    ]
)


def assert_clear_answer(response: Response) -> None:
    """A success, or a 4xx whose JSON says what was wrong; never a server error."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), response.text
        assert response.json()["detail"], response.text


@HOSTILE
@given(
    route=routes,
    queue=segments,
    number=numbers.map(quote),
    query=queries,
    send_body=send_bodies,
    task_body=task_bodies,
    raw=st.sampled_from([False, False, False, True]),
)
def test_hostile_requests_get_a_clear_4xx(
    client: TestClient,
    broker: Broker,
    queue: str,
    route: tuple[str, str],
    number: str,
    query: dict[str, str],
    send_body: Any,
    task_body: Any,
    raw: bool,
) -> None:
    if not broker.list_queues():
        broker.create_queue("orders")
    method, path = route
    body = send_body if path.endswith("/messages") else task_body
    params = "&".join(f"{encoded(name)}={encoded(value)}" for name, value in query.items())
    url = path.format(q=queue, n=number) + "?" + params
    content = json.dumps(body).encode()[:-1] if raw else json.dumps(body).encode()  # raw: cut
    response = client.request(
        method,
        url,
        content=content if method == "POST" else None,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    print("STATUS", response.status_code, method, path, response.text[:80].replace("\n", " "))
    assert_clear_answer(response)
    if response.status_code == 202:  # a task runs in a thread: let it finish, then check
        wait_for_task(client.app, response.json()["id"])  # type: ignore[arg-type]
    assert_balanced(broker)
