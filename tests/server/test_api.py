"""The JSON API, route by route, through the ASGI test client against a real SQLite file."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from poisonq import Broker, ManualClock
from poisonq.server import create_app
from tests.helpers import assert_balanced
from tests.server.conftest import AUTH, MALICIOUS, TOKEN, GatedClock, record, wait_for_task

DLQ = "orders/$deadletterqueue"


def test_entities_lists_queues_and_subqueues_with_counts(
    client: TestClient, dead: dict[str, list[int]]
) -> None:
    entities = client.get("/api/entities", headers=AUTH).json()
    by_name = {e["name"]: e for e in entities}
    assert set(by_name) == {"orders", DLQ, "orders;retry", "orders/$transfer/$deadletterqueue"}
    assert by_name["orders"]["counts"]["dead_lettered"] == 6
    assert by_name["orders"]["ledger"]["sent"] == 6
    assert by_name[DLQ]["subqueue"] == "deadletter"
    assert by_name[DLQ]["counts"]["dead_lettered"] == 6


def test_counts(client: TestClient, dead: dict[str, list[int]]) -> None:
    counts = client.get("/api/queues/orders/counts", headers=AUTH).json()
    assert counts == {
        "scheduled": 0,
        "active": 0,
        "locked": 0,
        "deferred": 0,
        "dead_lettered": 6,
        "completed": 0,
        "dropped": 0,
    }
    assert client.get(f"/api/queues/{DLQ}/counts", headers=AUTH).json()["dead_lettered"] == 6


def test_send_then_peek(client: TestClient, broker: Broker, queue: str) -> None:
    batch = {
        "messages": [
            {"body": '{"id": 1}', "subject": "order", "properties": {"region": "eu", "n": 2}},
            {"body": base64.b64encode(b"\x00\xff").decode(), "body_encoding": "base64"},
        ]
    }
    sent = client.post("/api/queues/orders/messages", json=batch, headers=AUTH)
    assert sent.status_code == 201
    seqs = sent.json()["sequence_numbers"]
    assert len(seqs) == 2
    peeked = client.get("/api/queues/orders/messages", headers=AUTH).json()
    assert [m["sequence_number"] for m in peeked] == seqs
    assert peeked[0]["body"] == '{"id": 1}' and peeked[0]["properties"] == {"region": "eu", "n": 2}
    assert peeked[1]["body_encoding"] == "base64"
    assert base64.b64decode(peeked[1]["body"]) == b"\x00\xff"
    # Peek locks nothing and counts no delivery.
    assert broker.counts(queue)["active"] == 2
    assert peeked[0]["delivery_count"] == 0
    assert_balanced(broker)


def test_peek_paging_and_subqueue(client: TestClient, dead: dict[str, list[int]]) -> None:
    first = client.get(
        "/api/queues/orders/messages?subqueue=deadletter&limit=2", headers=AUTH
    ).json()
    assert len(first) == 2
    after = first[-1]["sequence_number"] + 1
    rest = client.get(
        f"/api/queues/orders/messages?subqueue=deadletter&from_sequence={after}", headers=AUTH
    ).json()
    assert len(first) + len(rest) == 6
    assert {m["state"] for m in first + rest} == {"dead_lettered"}


def test_message_detail_has_the_failure_history(
    client: TestClient, dead: dict[str, list[int]]
) -> None:
    seq = dead["MaxDeliveryCountExceeded"][0]
    detail = client.get(f"/api/queues/{DLQ}/messages/{seq}", headers=AUTH).json()
    assert detail["dead_letter_reason"] == "MaxDeliveryCountExceeded"
    assert detail["delivery_count"] == 3
    assert [f["message"] for f in detail["failures"]] == ["'cust-17'", "'cust-42'", "'cust-99'"]
    assert len({f["fingerprint"] for f in detail["failures"]}) == 1
    assert "_lookup" in detail["failures"][0]["traceback"]
    same = client.get(f"/api/queues/orders/messages/{seq}?subqueue=deadletter", headers=AUTH)
    assert same.json() == detail


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("reason", {"InvalidOrder": 3, "MaxDeliveryCountExceeded": 3}),
        ("subject", {"order": 3, "refund": 2, "<b>refund</b>": 1}),
    ],
)
def test_groups(
    client: TestClient, dead: dict[str, list[int]], by: str, expected: dict[str, int]
) -> None:
    groups = client.get(f"/api/queues/orders/deadletters/groups?by={by}", headers=AUTH).json()
    assert {g["key"]: g["count"] for g in groups} == expected
    assert all(g["first_seen"] <= g["last_seen"] for g in groups)


def test_timeline(client: TestClient, dead: dict[str, list[int]]) -> None:
    answer = client.get("/api/queues/orders/deadletters/timeline?window=hour", headers=AUTH)
    found = answer.json()
    assert found["step"] == 60 and found["start"] == "2023-11-14T21:14:00Z"  # 59 min before now
    assert [(s["key"], len(s["counts"]), s["counts"][-1]) for s in found["series"]] == [
        ("InvalidOrder", 60, 3),
        ("MaxDeliveryCountExceeded", 60, 3),
    ]
    by_subject = client.get("/api/queues/orders/deadletters/timeline?by=subject", headers=AUTH)
    assert {s["key"]: sum(s["counts"]) for s in by_subject.json()["series"]} == {
        "order": 3,
        "refund": 2,
        "<b>refund</b>": 1,
    }
    by_fingerprint = client.get(
        "/api/queues/orders/deadletters/timeline?by=fingerprint", headers=AUTH
    ).json()["series"]
    assert {s["error_type"]: sum(s["counts"]) for s in by_fingerprint} == {
        "KeyError": 3,
        "ValueError": 2,
        None: 1,
    }
    bad = client.get("/api/queues/orders/deadletters/timeline?window=month", headers=AUTH)
    assert bad.status_code == 422


def test_groups_by_fingerprint_name_the_error_type(
    client: TestClient, dead: dict[str, list[int]]
) -> None:
    groups = client.get("/api/queues/orders/deadletters/groups?by=fingerprint", headers=AUTH)
    counted = {g["label"]: g["count"] for g in groups.json()}
    # KeyError at one place (3), ValueError at one place (2); the hostile one has no failure.
    assert counted == {"KeyError": 3, "ValueError": 2, None: 1}


def test_dead_letter_listing_with_filters_and_paging(
    client: TestClient, dead: dict[str, list[int]]
) -> None:
    url = "/api/queues/orders/deadletters"
    everything = client.get(url, headers=AUTH).json()
    assert [m["sequence_number"] for m in everything] == sorted(
        dead["MaxDeliveryCountExceeded"] + dead["InvalidOrder"] + dead["hostile"]
    )
    invalid = client.get(f"{url}?reason=InvalidOrder&subject=refund", headers=AUTH).json()
    assert [m["sequence_number"] for m in invalid] == dead["InvalidOrder"]
    fingerprint = everything[0]["failures"][-1]["fingerprint"]
    alike = client.get(f"{url}?fingerprint={fingerprint}", headers=AUTH).json()
    assert [m["sequence_number"] for m in alike] == dead["MaxDeliveryCountExceeded"]
    page = client.get(f"{url}?limit=2&after={everything[1]['sequence_number']}", headers=AUTH)
    assert [m["sequence_number"] for m in page.json()] == [
        m["sequence_number"] for m in everything[2:4]
    ]


def test_none_selects_the_dead_letters_without_a_value(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    url = "/api/queues/orders/deadletters"
    unfailed = client.get(f"{url}?fingerprint=none", headers=AUTH).json()
    assert [m["sequence_number"] for m in unfailed] == dead["hostile"]
    assert client.get(f"{url}?subject=none", headers=AUTH).json() == []
    purged = client.post(f"{url}/purge", json={"fingerprint": "none"}, headers=AUTH).json()
    assert purged["spec"]["where"]["fingerprint"] == "none"
    assert wait_for_task(client.app, purged["id"]).done == 1  # type: ignore[arg-type]
    assert broker.counts("orders")["dead_lettered"] == 5


def test_purge_drops_the_matching_dead_letters(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    purged = client.post(
        "/api/queues/orders/deadletters/purge", json={"subject": "refund"}, headers=AUTH
    )
    assert purged.status_code == 202  # started: the answer does not wait for the work
    task = purged.json()
    assert (task["kind"], task["total"]) == ("purge", 2)
    done = wait_for_task(client.app, task["id"])  # type: ignore[arg-type]
    assert (done.status, done.done) == ("completed", 2)
    followed = client.get(f"/api/tasks/{task['id']}", headers=AUTH).json()
    assert (followed["status"], followed["done"]) == ("completed", 2)
    assert broker.counts("orders")["dead_lettered"] == 4
    assert broker.get_queue(DLQ).ledger.dropped == 2
    assert_balanced(broker)


def test_resubmit_runs_as_a_task_and_sends_them_back(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    started = client.post(
        "/api/queues/orders/deadletters/resubmit",
        json={"reason": "MaxDeliveryCountExceeded", "rate": None},
        headers=AUTH,
    )
    assert started.status_code == 202
    task_id = started.json()["id"]
    # The server keeps the task it runs; wait for it through the server's own state.
    wait_for_task(client.app, task_id)  # type: ignore[arg-type]
    task = client.get(f"/api/tasks/{task_id}", headers=AUTH).json()
    assert (task["status"], task["done"], task["total"]) == ("completed", 3, 3)
    back = broker.peek("orders")
    assert [m.message_id for m in back] == ["o-0", "o-1", "o-2"]
    assert all(m.delivery_count == 0 and m.resubmit_count == 1 for m in back)
    assert all(len(m.failures) == 3 for m in back)  # the history is kept
    assert broker.counts("orders")["dead_lettered"] == 3
    assert_balanced(broker)


def test_resubmit_to_another_queue(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    broker.create_queue("orders-fixed")
    started = client.post(
        "/api/queues/orders/deadletters/resubmit",
        json={"subject": "refund", "to": "orders-fixed", "rate": None},
        headers=AUTH,
    ).json()
    wait_for_task(client.app, started["id"])  # type: ignore[arg-type]
    assert broker.counts("orders-fixed")["active"] == 2
    assert_balanced(broker)


def test_resubmit_progress_and_cancel(gated: tuple[Broker, GatedClock]) -> None:
    broker, clock = gated
    with TestClient(create_app(broker, token=TOKEN)) as client:
        # 5 messages a second: one message per chunk, then a pause (which waits here).
        started = client.post(
            "/api/queues/orders/deadletters/resubmit", json={"rate": 5}, headers=AUTH
        ).json()
        assert clock.sleeping.wait(10)
        running = client.get(f"/api/tasks/{started['id']}", headers=AUTH).json()
        assert (running["status"], running["done"], running["total"]) == ("running", 1, 10)
        cancelled = client.post(f"/api/tasks/{started['id']}/cancel", headers=AUTH).json()
        assert cancelled["status"] == "cancelled"
        clock.go.set()
        wait_for_task(client.app, started["id"])  # type: ignore[arg-type]
        final = client.get(f"/api/tasks/{started['id']}", headers=AUTH).json()
    assert (final["status"], final["done"]) == ("cancelled", 1)
    assert broker.counts("orders")["active"] == 1
    assert broker.counts("orders")["dead_lettered"] == 9
    assert_balanced(broker)


# Auth ---------------------------------------------------------------------------------------
WRITES = [
    ("/api/queues/orders/messages", {"messages": [{"body": "x"}]}),
    ("/api/queues/orders/deadletters/resubmit", {}),
    ("/api/queues/orders/deadletters/purge", {}),
    ("/api/tasks/1/cancel", None),
]


@pytest.mark.parametrize(("path", "body"), WRITES)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic czNjcmV0", f"bearer{TOKEN}"])
def test_a_write_without_the_token_gets_401_and_changes_nothing(
    open_client: TestClient,
    broker: Broker,
    dead: dict[str, list[int]],
    path: str,
    body: object,
    header: str | None,
) -> None:
    headers = {} if header is None else {"Authorization": header}
    answer = open_client.post(path, json=body, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.json()["error"] == "Unauthorized"  # the shape of every error (was detail only)
    assert broker.counts("orders")["dead_lettered"] == 6
    assert broker.counts("orders")["active"] == 0


READS = [
    "/api/entities",
    "/api/queues/orders/counts",
    "/api/queues/orders/messages",
    f"/api/queues/{DLQ}/messages/1",
    "/api/queues/orders/deadletters/groups",
    "/api/queues/orders/deadletters",
    "/api/tasks/1",
    "/metrics",
]


@pytest.mark.parametrize("path", READS)
def test_reads_need_the_token_unless_opened(
    client: TestClient, open_client: TestClient, dead: dict[str, list[int]], path: str
) -> None:
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get(path, headers=AUTH).status_code in (200, 404)  # task 1 may not exist
    assert open_client.get(path).status_code in (200, 404)


def test_the_token_lowercase_scheme_is_accepted(client: TestClient, queue: str) -> None:
    answer = client.get("/api/queues/orders/counts", headers={"Authorization": f"bearer {TOKEN}"})
    assert answer.status_code == 200


def test_a_generated_token_is_random_and_works(broker: Broker, queue: str) -> None:
    one, two = create_app(broker), create_app(broker)
    token = one.state.poisonq.auth.token
    assert len(token) >= 32 and token != two.state.poisonq.auth.token
    with TestClient(one) as client:
        assert client.get("/api/queues/orders/counts").status_code == 401
        answer = client.get(
            "/api/queues/orders/counts", headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200


# Errors are typed answers, never tracebacks ---------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("get", "/api/queues/nope/counts", None, 404, "EntityNotFoundError"),
        ("get", "/api/queues/bad!name/counts", None, 400, "InvalidNameError"),
        ("get", f"/api/queues/{DLQ}/messages/999", None, 404, "MessageNotFoundError"),
        ("get", "/api/tasks/999", None, 404, "TaskNotFoundError"),
        ("post", "/api/tasks/999/cancel", None, 404, "TaskNotFoundError"),
        ("post", "/api/queues/nope/messages", {"messages": [{"body": "x"}]}, 404, None),
        (
            "post",
            "/api/queues/orders/messages",
            {"messages": [{"body": "x" * 300_000}]},
            413,
            "MessageTooLargeError",
        ),
        (
            "post",
            "/api/queues/orders/messages",
            {"messages": [{"body": "!!", "body_encoding": "base64"}]},
            400,
            "InvalidOptionError",
        ),
        (
            "post",
            "/api/queues/orders/deadletters/resubmit",
            {"to": "nope"},
            404,
            "EntityNotFoundError",
        ),
    ],
)
def test_broker_errors_become_typed_answers(
    client: TestClient,
    broker: Broker,
    queue: str,
    method: str,
    path: str,
    body: object,
    status: int,
    error: str | None,
) -> None:
    answer = client.request(method, path, json=body, headers=AUTH)
    assert answer.status_code == status, answer.text
    if error:
        assert answer.json()["error"] == error
    assert_balanced(broker)


def test_an_unknown_queue_is_named_with_the_closest_names(client: TestClient, queue: str) -> None:
    answer = client.get("/api/queues/ordres/deadletters/groups", headers=AUTH)
    assert answer.status_code == 404
    assert answer.json() == {
        "error": "EntityNotFoundError",
        "detail": "no queue 'ordres'; did you mean 'orders'?",
    }


def test_a_disabled_queue_refuses_a_send_with_409(
    client: TestClient, broker: Broker, queue: str
) -> None:
    broker.disable(queue)
    answer = client.post("/api/queues/orders/messages", json={"messages": [{}]}, headers=AUTH)
    assert (answer.status_code, answer.json()["error"]) == (409, "EntityDisabledError")


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"body": "x", "unknown": 1}]},
        {"messages": [{"properties": {"a": [1]}}]},
    ],
)
def test_malformed_requests_get_422(client: TestClient, queue: str, body: object) -> None:
    """In the shape of every other error: its type, and what was wrong in one line."""
    answer = client.post("/api/queues/orders/messages", json=body, headers=AUTH)
    assert answer.status_code == 422
    assert answer.json().keys() == {"error", "detail"}
    assert answer.json()["error"] == "RequestValidationError"
    assert isinstance(answer.json()["detail"], str) and ": " in answer.json()["detail"]


def test_the_rate_must_be_positive(client: TestClient, dead: dict[str, list[int]]) -> None:
    answer = client.post("/api/queues/orders/deadletters/resubmit", json={"rate": 0}, headers=AUTH)
    assert answer.status_code == 422
    assert answer.json() == {
        "error": "RequestValidationError",
        "detail": "rate: Input should be greater than 0",
    }


def test_json_answers_carry_the_body_as_data_not_html(
    client: TestClient, dead: dict[str, list[int]]
) -> None:
    seq = dead["hostile"][0]
    answer = client.get(f"/api/queues/{DLQ}/messages/{seq}", headers=AUTH)
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.json()["body"] == MALICIOUS


def test_the_openapi_document_lists_every_route(client: TestClient) -> None:
    document = client.get("/api/openapi.json", headers=AUTH).json()
    paths = document["paths"]
    assert {
        "/api/entities",
        "/api/queues/{queue}/counts",
        "/api/queues/{queue}/messages",
        "/api/queues/{queue}/messages/{sequence_number}",
        "/api/queues/{queue}/deadletters/groups",
        "/api/queues/{queue}/deadletters/timeline",
        "/api/queues/{queue}/deadletters",
        "/api/queues/{queue}/deadletters/resubmit",
        "/api/queues/{queue}/deadletters/purge",
        "/api/tasks/{task_id}",
        "/api/tasks/{task_id}/cancel",
        "/metrics",
    } <= set(paths)
    assert "HTTPBearer" in document["components"]["securitySchemes"]


def test_a_queue_name_with_slashes_is_one_path(client: TestClient, broker: Broker) -> None:
    broker.create_queue("team/orders/eu")
    sent = client.post(
        "/api/queues/team/orders/eu/messages",
        json={"messages": [{"body": "x"}]},
        headers=AUTH,
    )
    assert sent.status_code == 201
    counts = client.get("/api/queues/team/orders/eu/counts", headers=AUTH).json()
    assert counts["active"] == 1


def test_pipelines_and_a_consumers_timeline(
    client: TestClient, broker: Broker, clock: ManualClock, queue: str
) -> None:
    assert client.get("/api/pipelines", headers=AUTH).json() == []
    record(broker, clock, queue, "nightly", [3, 4])
    [listed] = client.get("/api/pipelines", headers=AUTH).json()
    assert (listed["queue"], listed["consumer"], listed["batches"]) == ("orders", "nightly", 2)
    assert listed["last"]["lease"] == 2 and listed["last"]["dead_lettered"] == {MALICIOUS: 1}
    batches = client.get("/api/pipelines/nightly/batches", headers=AUTH).json()
    assert [(b["lease"], b["size"], b["completed"], b["seconds"]) for b in batches] == [
        (1, 3, 3, 1.0),
        (2, 4, 3, 2.0),
    ]
    missing = client.get("/api/pipelines/nightlly/batches?queue=orders", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"] == "PipelineNotFoundError"
    assert client.get("/api/pipelines").status_code == 401


def test_an_error_that_echoes_a_lone_surrogate_is_a_clear_4xx(
    client: TestClient, queue: str
) -> None:
    """JSON may escape a lone surrogate, which UTF-8 cannot encode: the validation error that
    echoed it failed to render (a 500), and so did the store that was sent it."""
    headers = {**AUTH, "Content-Type": "application/json"}
    no_batch = b'{"until": "\\ud800"}'
    refused = client.post("/api/queues/orders/messages", content=no_batch, headers=headers)
    assert refused.status_code == 422
    assert refused.json()["error"] == "RequestValidationError"
    assert "until: Extra inputs are not permitted" in refused.json()["detail"]
    bad_text = b'{"messages": [{"body": "\\ud800"}]}'
    refused = client.post("/api/queues/orders/messages", content=bad_text, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"] == "InvalidOptionError"


def test_a_task_that_selects_nothing_is_not_started_and_says_what_there_is(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    """A task whose selection is empty is refused (404 ``NothingSelectedError``) with what
    there is, as on the command line: no task of zero messages is started."""
    url = "/api/queues/orders/deadletters"
    for action in ("purge", "resubmit"):
        answer = client.post(f"{url}/{action}", json={"reason": "Nope"}, headers=AUTH)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"] == "NothingSelectedError"
        assert (
            "by reason, there are InvalidOrder 3, MaxDeliveryCountExceeded 3"
            in (answer.json()["detail"])
        )
    assert broker.tasks("orders") == []
