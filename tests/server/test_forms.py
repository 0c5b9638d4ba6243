"""A form the server cannot take comes back as it was filled in, saying why on the form,
not as a page titled with an exception's name."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from poisonq import Broker
from tests.server.conftest import finished
from tests.server.test_ui import login


@pytest.mark.parametrize(
    ("rate", "to", "why"),
    [
        ("fast", "", "rate must be a number of messages per second"),
        ("-5", "", "rate must be messages per second &gt; 0"),
        ("20", "orders-fixd", "no queue &#39;orders-fixd&#39;"),
        ("20", "bad name!", "invalid entity name"),
    ],
)
def test_a_resubmit_the_broker_refuses_comes_back_filled_in(
    client: TestClient,
    broker: Broker,
    dead: dict[str, list[int]],
    rate: str,
    to: str,
    why: str,
) -> None:
    csrf = login(client)
    form = {"csrf": csrf, "queue": "orders", "reason": "InvalidOrder", "rate": rate, "to": to}
    answer = client.post("/ui/resubmit", data=form)
    assert answer.status_code == 400
    assert re.search(
        rf'<p class="err" id="invalid" role="alert">Nothing started: {why}', answer.text
    )
    assert f'name="rate" value="{rate}"' in answer.text
    assert f'name="to" value="{to}"' in answer.text
    assert 'name="reason" value="InvalidOrder"' in answer.text  # the same selection
    assert "<title>Confirm resubmit" in answer.text and "InvalidOptionError" not in answer.text
    assert broker.counts("orders")["dead_lettered"] == 6


def test_a_filter_that_does_not_parse_comes_back_in_the_explorer(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    path = "/ui/deadletters?queue=orders&reason=InvalidOrder&min_sequence=ten&max_sequence=9"
    answer = open_client.get(path)
    assert answer.status_code == 400
    assert 'id="invalid" role="alert">Nothing selected: min_sequence must be a whole number' in (
        answer.text
    )
    for name, value in (("reason", "InvalidOrder"), ("min_sequence", "ten"), ("max_sequence", "9")):
        assert re.search(rf'name="{name}" value="{value}"', answer.text), name
    assert 'id="groups"' in answer.text  # the groups are still there to pick from
    assert 'id="resubmit"' not in answer.text and 'id="messages"' not in answer.text


def test_an_error_page_is_titled_for_people(open_client: TestClient, queue: str) -> None:
    answer = open_client.get("/ui/deadletters?queue=nope")
    assert answer.status_code == 404
    assert "<h1>Not found</h1>" in answer.text
    assert 'id="error" role="alert">no queue &#39;nope&#39;' in answer.text
    assert 'id="error-kind">EntityNotFoundError<' in answer.text


def test_a_missing_or_malformed_ui_address_is_a_page(open_client: TestClient, queue: str) -> None:
    for path, status in (
        ("/ui/nowhere", 404),
        ("/ui/tasks/999", 404),
        ("/ui/tasks/first", 400),
        ("/ui/deadletters?queue=orders&after=-1", 400),
    ):
        answer = open_client.get(path)
        assert answer.status_code == status, path
        assert answer.headers["content-type"].startswith("text/html"), path
        assert 'id="error" role="alert">' in answer.text, path
    assert open_client.get("/api/nowhere").json() == {"error": "NotFound", "detail": "Not Found"}
    assert open_client.get("/api/tasks/first").status_code == 422


def test_a_resubmit_at_rate_0_has_no_limit_as_on_the_command_line(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    """Rate 0 means no limit, in the form as on the command line."""
    csrf = login(client)
    form = {"csrf": csrf, "queue": "orders", "reason": "InvalidOrder", "rate": "0"}
    page = finished(client, client.post("/ui/resubmit", data=form, follow_redirects=False))
    assert "completed" in page
    (task,) = broker.tasks("orders")
    assert task.spec["rate"] is None and task.done == task.total > 0
