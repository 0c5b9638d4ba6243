"""The web UI through the ASGI test client: pages, escaping, login, CSRF, resubmit and purge
with confirmation. (The same flows run in a real browser in test_browser.py.)"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from poisonq import Broker, Message
from poisonq.server import create_app
from poisonq.server.pages import body_view
from poisonq.server.sessions import SESSION_COOKIE
from tests.helpers import assert_balanced, execute_behind_the_back
from tests.server.conftest import TOKEN, GatedClock, finished, wait_for_task

DLQ = "orders/$deadletterqueue"
OPERATOR = "Ada Lovelace"


def login(client: TestClient) -> str:
    """Log in through the form; returns the CSRF value the pages then carry."""
    answer = client.post("/ui/login", data={"token": TOKEN, "operator": OPERATOR, "next": "/ui/"})
    assert answer.status_code == 200  # followed the redirect to the overview
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', answer.text)
    assert found, answer.text
    return found.group(1)


def test_pages_need_a_login_when_reads_are_closed(client: TestClient, queue: str) -> None:
    answer = client.get("/ui/deadletters?queue=orders", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/login?next=%2Fui%2Fdeadletters%3Fqueue%3Dorders"
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/"


def test_login_sets_a_strict_httponly_cookie_not_the_token(client: TestClient, queue: str) -> None:
    wrong = client.post("/ui/login", data={"token": "guess", "operator": OPERATOR, "next": "/ui/"})
    assert wrong.status_code == 401 and "not the token" in wrong.text
    answer = client.post(
        "/ui/login",
        data={"token": TOKEN, "operator": OPERATOR, "next": "/ui/deadletters?queue=orders"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/deadletters?queue=orders"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert TOKEN not in cookie
    assert client.get("/ui/deadletters?queue=orders").status_code == 200


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/ui/", "/api/x"])
def test_login_redirects_only_inside_the_ui(client: TestClient, target: str) -> None:
    form = {"token": TOKEN, "operator": OPERATOR, "next": target}
    answer = client.post("/ui/login", data=form, follow_redirects=False)
    assert answer.headers["location"] == "/ui/"


def test_overview_shows_depths_per_subqueue(
    open_client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    broker.sender("orders").send([Message(body="x"), Message(body="y")])
    page = open_client.get("/ui/")
    assert page.status_code == 200
    row = re.search(
        r'<tr>\s*<td class="clip" title="orders">'
        r'<a href="/ui/deadletters\?queue=orders">orders</a>(.*?)</tr>',
        page.text,
        re.S,
    )
    assert row, page.text
    numbers = re.findall(r'<td class="n[^"]*">\s*(?:<a[^>]*>)?(\d+)', row.group(1))
    # dead-letter (first: what a phone shows beside the name), active, scheduled, locked,
    # deferred, retry, transfer DLQ, completed, dropped
    assert numbers == ["6", "2", "0", "0", "0", "0", "0", "0", "0"]

    broker.purge("orders", reason="InvalidOrder")  # dropped from the dead-letter queue...
    page = open_client.get("/ui/")
    row = re.search(r'title="orders">.*?</tr>', page.text, re.S)
    assert row
    numbers = re.findall(r'<td class="n[^"]*">\s*(?:<a[^>]*>)?(\d+)', row.group(0))
    dropped = 6 - int(numbers[0])
    assert dropped > 0 and numbers[-1] == str(dropped)  # ...counts as the queue's drops


def test_every_page_forbids_scripts(open_client: TestClient, dead: dict[str, list[int]]) -> None:
    for path in (
        "/ui/",
        "/ui/deadletters?queue=orders",
        f"/ui/message?address={DLQ}&seq=1",
        "/ui/login",
        "/ui/confirm?queue=orders&action=purge",
    ):
        answer = open_client.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["content-security-policy"]
        assert "script-src 'none'" in policy and "default-src 'none'" in policy
        # Framed by this server's own pages only (a running task's progress frame).
        assert "frame-ancestors 'self'" in policy and "frame-src 'self'" in policy
        assert answer.headers["x-frame-options"] == "SAMEORIGIN"
        assert "<script" not in answer.text.lower()


def test_explorer_groups_and_lists_and_escapes(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders&by=subject").text
    assert "<b>refund</b>" not in page
    assert "&lt;b&gt;refund&lt;/b&gt;" in page
    assert "<script" not in page and "onerror=" not in page.replace("onerror=&#34;", "")
    assert "&lt;script&gt;window.__pwned = true&lt;/script&gt;" in page
    assert re.search(r'id="matching">6<', page)
    reasons = open_client.get("/ui/deadletters?queue=orders&reason=InvalidOrder").text
    assert re.search(r'id="matching">3<', reasons)
    assert "MaxDeliveryCountExceeded" in reasons  # the group table still lists every group
    fingerprints = open_client.get("/ui/deadletters?queue=orders&by=fingerprint").text
    assert "KeyError" in fingerprints and "ValueError" in fingerprints


def _highlighted(page: str) -> list[str]:
    """The keys of the groups the explorer shows as selected: by a tick and aria-current,
    not by colour alone."""
    selected = r'<tr class="on">\s*<td[^>]*><a class="mono" href="[^"]*" aria-current="true">✓ '
    return re.findall(selected + r"([^<]*)</a>", page)


def test_the_none_group_link_selects_exactly_its_members(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders&by=fingerprint").text
    assert re.search(r'id="matching">6<', page)
    assert _highlighted(page) == []  # nothing is selected, so no group is highlighted
    link = re.search(r'<a class="mono" href="([^"]*)">\(none\)</a>', page)
    assert link and "fingerprint=none" in link.group(1)
    selected = open_client.get("/ui/deadletters" + link.group(1).replace("&amp;", "&")).text
    assert re.search(r'id="matching">1<', selected)
    assert _highlighted(selected) == ["(none)"]
    assert "fingerprint=none" in selected  # the chip, and the actions' links
    confirm = open_client.get("/ui/confirm?queue=orders&action=purge&fingerprint=none").text
    assert "Drop <strong>1</strong>" in confirm


def test_explorer_without_login_offers_no_change(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    page = open_client.get("/ui/deadletters?queue=orders").text
    assert "Log in to resubmit or purge" in page
    assert 'id="resubmit"' not in page


def test_message_page_shows_pretty_json_properties_and_history(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    seq = dead["MaxDeliveryCountExceeded"][0]
    page = open_client.get(f"/ui/message?address={DLQ}&seq={seq}").text
    assert '<pre class="body" id="body">{\n  &#34;id&#34;: 0\n}</pre>' in page
    assert page.count('<span class="err">KeyError</span>') == 3
    assert "&#39;cust-42&#39;" in page
    assert "MaxDeliveryCountExceeded" in page


def test_message_page_escapes_a_hostile_body_and_properties(
    open_client: TestClient, dead: dict[str, list[int]]
) -> None:
    seq = dead["hostile"][0]
    page = open_client.get(f"/ui/message?address={DLQ}&seq={seq}").text
    assert "<script" not in page and "<img" not in page
    escaped = "&lt;script&gt;window.__pwned = true&lt;/script&gt;&lt;img src=x"
    assert page.count(escaped) == 3  # body, property, dead-letter description


def test_body_views() -> None:
    assert body_view(b'{"a":[1,2]}') == ("json", '{\n  "a": [\n    1,\n    2\n  ]\n}')
    assert body_view(b"plain <text>") == ("text", "plain <text>")
    assert body_view(b"\xff\x00") == ("binary", "/wA=")


def test_resubmit_through_the_ui_with_confirmation(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    csrf = login(client)
    explorer = client.get("/ui/deadletters?queue=orders&reason=MaxDeliveryCountExceeded").text
    link = re.search(r'id="resubmit" href="([^"]+)"', explorer)
    assert link
    confirm = client.get("/ui/" + link.group(1).replace("&amp;", "&"))
    assert re.search(r"Send <strong>3</strong> dead-lettered message", confirm.text)
    assert f'name="csrf" value="{csrf}"' in confirm.text
    form = {"csrf": csrf, "queue": "orders", "reason": "MaxDeliveryCountExceeded", "rate": ""}
    answer = client.post("/ui/resubmit", data=form, follow_redirects=False)
    assert answer.status_code == 303
    task_id = int(answer.headers["location"].split("/")[3].split("?")[0])
    wait_for_task(client.app, task_id)  # type: ignore[arg-type]
    page = client.get(answer.headers["location"]).text
    assert 'id="task-status">completed<' in page and "3 of 3" in page
    assert 'http-equiv="refresh"' not in page  # only a running task's page reloads itself
    assert broker.counts("orders")["active"] == 3
    assert broker.counts("orders")["dead_lettered"] == 3
    assert_balanced(broker)


def test_purge_one_message_from_its_page(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    csrf = login(client)
    seq = dead["hostile"][0]
    page = client.get(f"/ui/message?address={DLQ}&seq={seq}").text
    link = re.search(r'id="purge" href="([^"]+)"', page)
    assert link
    confirm = client.get("/ui/" + link.group(1).replace("&amp;", "&")).text
    assert "Drop <strong>1</strong>" in confirm
    assert 'name="count"' not in confirm  # a purge with a filter needs no count typed
    form = {"csrf": csrf, "queue": "orders", "min_sequence": str(seq), "max_sequence": str(seq)}
    answer = client.post("/ui/purge", data=form, follow_redirects=False)
    assert 'id="task-status">completed<' in finished(client, answer)
    assert [m.sequence_number for m in broker.peek(DLQ, max_messages=10)] == sorted(
        dead["MaxDeliveryCountExceeded"] + dead["InvalidOrder"]
    )
    assert_balanced(broker)


def test_purging_a_whole_dead_letter_queue_needs_its_count_typed(
    client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    csrf = login(client)
    confirm = client.get("/ui/confirm?queue=orders&action=purge").text
    assert "Drop <strong>6</strong>" in confirm
    assert "type <strong>6</strong> to drop them all" in confirm and 'name="count"' in confirm
    form = {"csrf": csrf, "queue": "orders"}
    for typed, why in (("", "type the number"), ("3200", "3200 is not the number")):
        refused = client.post("/ui/purge", data={**form, "count": typed})
        assert refused.status_code == 400
        assert re.search(
            rf'id="refused" role="alert">Nothing was dropped: {why} of dead letters', refused.text
        )
        assert (
            "now, 6." in refused.text and f'name="count" id="count" value="{typed}"' in refused.text
        )
        assert broker.counts("orders")["dead_lettered"] == 6
    done = client.post("/ui/purge", data={**form, "count": "6"}, follow_redirects=False)
    assert 'id="task-status">completed<' in finished(client, done)
    assert broker.counts("orders")["dead_lettered"] == 0
    assert_balanced(broker)


@pytest.mark.parametrize("path", ["/ui/resubmit", "/ui/purge", "/ui/tasks/1/cancel", "/ui/logout"])
def test_ui_changes_need_the_session_and_the_csrf_value(
    client: TestClient,
    open_client: TestClient,
    broker: Broker,
    dead: dict[str, list[int]],
    path: str,
) -> None:
    form = {"queue": "orders"}
    assert open_client.post(path, data={**form, "csrf": "x"}).status_code == 401
    csrf = login(client)
    # Logged in, a form without the session's CSRF value has expired (was "Log in first"):
    missing = client.post(path, data=form)
    assert missing.status_code == 403 and "Form expired" in missing.text
    wrong = csrf[:-1] + ("1" if csrf.endswith("0") else "0")
    assert client.post(path, data={**form, "csrf": wrong}).status_code == 403
    assert broker.counts("orders")["dead_lettered"] == 6


def test_cancel_from_the_task_page(gated: tuple[Broker, GatedClock]) -> None:
    broker, clock = gated
    with TestClient(create_app(broker, token=TOKEN)) as client:
        csrf = login(client)
        task = broker.resubmit("orders", rate=5, wait=False)  # as another process would
        assert clock.sleeping.wait(10)
        page = client.get(f"/ui/tasks/{task.id}?queue=orders").text
        assert 'id="cancel"' in page and "http-equiv" not in page  # the page stays still
        frame = f'src="/ui/tasks/{task.id}/progress?queue=orders"'
        assert '<iframe id="task-frame" class="task-frame" title="Progress of task' in page
        assert frame in page
        progress = client.get(f"/ui/tasks/{task.id}/progress?queue=orders")
        assert progress.headers["refresh"] == "2" and "1 of 10" in progress.text
        form = {"csrf": csrf, "queue": "orders"}
        answer = client.post(f"/ui/tasks/{task.id}/cancel", data=form)
        assert 'id="task-status">cancelled<' in answer.text
        progress = client.get(f"/ui/tasks/{task.id}/progress?queue=orders")
        assert "refresh" not in progress.headers  # a finished task's frame stops reloading
        assert 'target="_top">Show the cancelled task</a>' in progress.text
        clock.go.set()
        assert task.wait(10).status == "cancelled"
    assert broker.counts("orders")["dead_lettered"] == 9
    assert_balanced(broker)


def test_errors_are_pages_with_escaped_text(open_client: TestClient, queue: str) -> None:
    missing = open_client.get("/ui/deadletters?queue=nope")
    assert missing.status_code == 404 and "EntityNotFoundError" in missing.text
    bad = open_client.get("/ui/deadletters?queue=%3Cscript%3E")
    assert bad.status_code == 400 and "<script>" not in bad.text and "&lt;script&gt;" in bad.text
    assert open_client.get("/ui/confirm?queue=orders&action=drop").status_code == 400


def test_the_explorer_pages_through_many_messages(open_client: TestClient, broker: Broker) -> None:
    broker.create_queue("orders")
    broker.sender("orders").send([Message(body=str(n)) for n in range(55)])
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(max_messages=55), "Broken")
    first = open_client.get("/ui/deadletters?queue=orders").text
    rows = re.findall(r'<a href="message\?address=[^"]+">(\d+)</a>', first)
    assert rows == [str(n) for n in range(1, 51)]
    following = re.search(r'<a href="([^"]+)">next page', first)
    assert following
    second = open_client.get("/ui/deadletters" + following.group(1).replace("&amp;", "&")).text
    assert re.findall(r'<a href="message\?address=[^"]+">(\d+)</a>', second) == [
        str(n) for n in range(51, 56)
    ]
    assert "next page" not in second


def test_the_audit_page_shows_each_entitys_ledger_and_whether_it_balances(
    open_client: TestClient, broker: Broker, dead: dict[str, list[int]]
) -> None:
    """ "The audit balances" could be confirmed only with the command line: the page shows
    what ``broker.audit()`` says, entity by entity, counts with thousands separators."""
    broker.create_queue("bulk")
    broker.sender("bulk").send([Message(body=str(n)) for n in range(1200)])
    page = open_client.get("/ui/audit")
    assert page.status_code == 200
    report = broker.audit()
    assert report.ok
    verdict = re.search(r'<p id="verdict"[^>]*>(.*?)</p>', page.text, re.S)
    assert verdict and "✓ The ledger balances:" in verdict.group(1)
    assert f"{report.sent:,} sent" in verdict.group(1) and "1,2" in verdict.group(1)
    rows = re.findall(r'<td class="name">([^<]+)</td>(.*?)</tr>', page.text, re.S)
    assert {name for name, _ in rows} == {entry.name for entry in report.entries}
    bulk = dict(rows)["bulk"]
    assert re.findall(r'<td class="n">([\d,]+)</td>', bulk)[:1] == ["1,200"]
    assert all('status completed">yes' in cells for _, cells in rows)
    assert_balanced(broker)


def test_the_audit_page_names_the_entities_out_of_balance_above_the_table(
    open_client: TestClient, broker: Broker, url: str, queue: str
) -> None:
    """An unbalanced ledger names its entities in the verdict, and each row says whether it
    balances right after its name, so a phone's narrow screen shows which one without
    scrolling sideways."""
    broker.create_queue("bulk")
    broker.sender("bulk").send([Message(body=b"x")])
    execute_behind_the_back(url, "UPDATE entities SET sent = sent + 7 WHERE name = 'bulk'")
    page = open_client.get("/ui/audit").text
    named = re.search(r'<p id="unbalanced"[^>]*>(.*?)</p>', page, re.S)
    assert named and re.sub(r"<[^>]+>", "", named.group(1)) == "Out of balance: bulk."
    rows = dict(re.findall(r'<td class="name">([^<]+)</td>\s*<td>(.*?)</td>', page, re.S))
    assert 'failed">no' in rows["bulk"] and 'completed">yes' in rows[queue]


def test_the_audit_page_shows_the_deleted_entities_row_once_a_queue_with_messages_went(
    open_client: TestClient, broker: Broker
) -> None:
    """The deleted entities' ledgers are a row of the table, and the sentence that explains
    it, only once an entity with messages was deleted; the verdict's sign says whether the
    global sum balances."""
    broker.create_queue("scratch")
    assert "deleted entities" not in open_client.get("/ui/audit").text
    broker.sender("scratch").send([Message(body=b"x")] * 3)
    broker.delete_queue("scratch")
    page = open_client.get("/ui/audit").text
    rows = dict(re.findall(r'<td class="name">([^<]+)</td>(.*?)</tr>', page, re.S))
    assert re.findall(r'<td class="n">([\d,]+)</td>', rows["(deleted entities)"])[:4] == [
        "3", "0", "0", "3"
    ]  # fmt: skip
    assert "The row of the deleted entities" in page and "3 sent =" in page


def test_the_overview_says_why_a_queue_is_not_active_in_the_page(
    open_client: TestClient, broker: Broker, queue: str
) -> None:
    """The cause was only in a tooltip (as the stored JSON), which a keyboard, a phone or a
    screen reader never shows: it is the cause's description, beside the status."""
    broker.set_status(queue, "disabled", "paused for the 02:00 migration")
    page = open_client.get("/ui/").text
    assert re.search(
        r'<span class="status disabled">disabled</span> '
        r'<span class="muted small status-cause">paused for the 02:00 migration</span>',
        page,
    )
