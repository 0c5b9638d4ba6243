"""The tasks page, who started each task, and one task at a time per queue (a second tab,
or a confirmation page the Back button brought back, must not start a second resubmit over
the same messages)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from poisonq import Broker
from poisonq.server import create_app
from tests.helpers import assert_balanced
from tests.server.conftest import AUTH, TOKEN, GatedClock, finished, wait_for_task
from tests.server.test_ui import OPERATOR, login


def test_every_page_links_to_the_tasks(open_client: TestClient, dead: dict[str, list[int]]) -> None:
    for path in ("/ui/", "/ui/deadletters?queue=orders"):
        assert 'href="/ui/tasks"' in open_client.get(path).text, path


def test_the_tasks_page_lists_every_task_and_who_started_it(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    """The page lists the tasks in the store, whichever process started them and when, not
    only those of this server since it started."""
    csrf = login(client)
    assert "No task yet" in client.get("/ui/tasks").text
    form = {"csrf": csrf, "queue": "orders", "reason": "InvalidOrder", "rate": ""}
    resubmitted = client.post("/ui/resubmit", data=form, follow_redirects=False)
    task_id = int(resubmitted.headers["location"].split("/")[3].split("?")[0])
    wait_for_task(client.app, task_id)  # type: ignore[arg-type]
    one = str(dead["MaxDeliveryCountExceeded"][0])
    purge = {"csrf": csrf, "queue": "orders", "min_sequence": one, "max_sequence": one}
    finished(client, client.post("/ui/purge", data=purge, follow_redirects=False))
    api = client.post("/api/queues/orders/deadletters/purge", json={}, headers=AUTH).json()
    wait_for_task(client.app, api["id"])  # type: ignore[arg-type]
    broker.purge("orders", min_sequence=1, started_by="ops-script")  # another process's
    page = client.get("/ui/tasks").text
    rows = re.findall(
        r'<tr>\s*<td class="n"><a href="/ui/tasks/(\d+)\?queue=orders">.*?</td>\s*'
        r'<td>(\w+)</td>.*?"status (\w+)".*?'
        r'<td class="n">(\d+) of (\d+)</td>\s*<td[^>]*>([^<]*)</td>',
        page,
        re.S,
    )
    assert rows == [
        (str(api["id"] + 1), "purge", "completed", "0", "0", "ops-script"),
        (str(api["id"]), "purge", "completed", "2", "2", "a client of the API"),
        (str(task_id + 1), "purge", "completed", "1", "1", OPERATOR),
        (str(task_id), "resubmit", "completed", "3", "3", OPERATOR),
    ]
    assert 'title="reason=InvalidOrder">reason=InvalidOrder</span>' in page
    assert f'title="min_sequence={one}">min_sequence={one}</span>' in page
    task_page = client.get(f"/ui/tasks/{task_id}").text
    assert f'id="started-by">Started by {OPERATOR}, <time' in task_page
    assert 'id="selection">Selection: <span class="chip" title="reason=InvalidOrder">' in task_page
    opened = client.get(f"/ui/tasks?id={task_id}", follow_redirects=False)
    assert opened.status_code == 303 and opened.headers["location"] == f"/ui/tasks/{task_id}"


def test_a_second_task_on_a_queue_is_refused_while_one_runs(
    gated: tuple[Broker, GatedClock],
) -> None:
    broker, clock = gated
    with TestClient(create_app(broker, token=TOKEN)) as client:
        csrf = login(client)
        form = {"csrf": csrf, "queue": "orders", "rate": "5"}
        first = client.post("/ui/resubmit", data=form, follow_redirects=False)
        assert first.status_code == 303
        running = int(first.headers["location"].split("/")[3].split("?")[0])
        assert clock.sleeping.wait(10)  # one chunk moved, the task waits for the next
        # The same confirmation page, submitted again (Back, or a second tab):
        again = client.post("/ui/resubmit", data=form)
        assert again.status_code == 409
        assert re.search(
            rf'id="busy" role="alert">Nothing started: task {running} is already', again.text
        )
        assert 'id="confirm"' not in again.text
        purge = client.post("/ui/purge", data={"csrf": csrf, "queue": "orders", "count": "9"})
        assert purge.status_code == 409 and 'id="busy"' in purge.text
        confirm = client.get("/ui/confirm?queue=orders&action=resubmit").text
        assert 'id="busy"' in confirm and 'id="confirm"' not in confirm
        api = client.post("/api/queues/orders/deadletters/resubmit", json={}, headers=AUTH)
        assert api.status_code == 409 and api.json()["error"] == "TaskRunningError"
        assert broker.counts("orders")["dead_lettered"] == 9  # nothing else moved
        broker.cancel_task(running)
        clock.go.set()
        wait_for_task(client.app, running)  # type: ignore[arg-type]
        # Once it has ended, the queue takes a task again.
        form["rate"] = ""
        after = client.post("/ui/resubmit", data=form, follow_redirects=False)
        assert after.status_code == 303
        wait_for_task(client.app, int(after.headers["location"].split("/")[3].split("?")[0]))  # type: ignore[arg-type]
    assert broker.counts("orders")["dead_lettered"] == 0
    assert_balanced(broker)


def test_who_cancelled_a_task_is_on_its_page_the_list_and_the_api(
    gated: tuple[Broker, GatedClock],
) -> None:
    broker, clock = gated
    with TestClient(create_app(broker, token=TOKEN)) as client:
        csrf = login(client)
        started = client.post("/ui/resubmit", data={"csrf": csrf, "queue": "orders", "rate": "5"})
        task_id = int(re.search(r"Resubmit task (\d+)", started.text)[1])  # type: ignore[index]
        assert clock.sleeping.wait(10)
        assert client.get(f"/api/tasks/{task_id}", headers=AUTH).json()["cancelled_by"] is None
        cancelled = client.post(f"/ui/tasks/{task_id}/cancel", data={"csrf": csrf, "queue": ""})
        assert f'id="cancelled-by">Cancelled by {OPERATOR}, <time' in cancelled.text
        listed = client.get("/ui/tasks").text
        assert f'title="cancelled by {OPERATOR}"' in listed
        assert f'<span class="muted small cancelled-by">by {OPERATOR}</span>' in listed
        answer = client.get(f"/api/tasks/{task_id}", headers=AUTH).json()
        assert (answer["status"], answer["cancelled_by"]) == ("cancelled", OPERATOR)
        # Cancelling it again (it has ended) changes nothing, nor who did it.
        again = client.post(f"/api/tasks/{task_id}/cancel", headers=AUTH).json()
        assert again["cancelled_by"] == OPERATOR
        clock.go.set()
        wait_for_task(client.app, task_id)  # type: ignore[arg-type]
        # Through the API, the token is all there is to know of who.
        clock.go.clear()
        other = broker.resubmit("orders", rate=5, wait=False)  # another process's task
        by_api = client.post(f"/api/tasks/{other.id}/cancel", headers=AUTH).json()
        assert (by_api["status"], by_api["cancelled_by"]) == ("cancelled", "a client of the API")
        page = client.get(f"/ui/tasks/{other.id}").text
        assert 'id="cancelled-by">Cancelled by a client of the API, <time' in page
        clock.go.set()
        other.wait(10)


def test_a_task_that_moves_elsewhere_says_where(
    open_client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    broker.create_queue("orders-fixed")
    task = broker.resubmit("orders", to="orders-fixed", rate=None, started_by="ops")
    for page in (open_client.get("/ui/tasks").text, open_client.get(f"/ui/tasks/{task.id}").text):
        assert '<span class="chip" title="to orders-fixed">to orders-fixed</span>' in page
