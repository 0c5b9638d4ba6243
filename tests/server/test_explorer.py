"""Triage at a glance in the explorer's listing: the error's message (not a qualified type
name), newest first on request, relative times with the exact one in a title, and binary
bodies shown as binary."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from poisonq import Broker, ManualClock, Message
from poisonq.server.listing import newest_dead_letters
from poisonq.server.pages import ago, size


class UpstreamTimeout(Exception):
    """An application's own exception, so its type name is qualified by its module."""


def _rows(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'<a href="message\?address=[^"]+">(\d+)</a>', page)]


def test_the_listing_shows_the_error_message_with_the_full_type_in_the_title(
    open_client: TestClient, broker: Broker, queue: str
) -> None:
    broker.sender("orders").send(Message(body=b"{}"))
    receiver = broker.receiver("orders")
    error = UpstreamTimeout("payments.example did not answer in 30 s")
    receiver.dead_letter(receiver.receive(), "Timeout", error=error)
    page = open_client.get("/ui/deadletters?queue=orders").text
    qualified = f"{__name__}.UpstreamTimeout"
    cell = re.search(r'<td class="clip error" title="([^"]*)">(.*?)</td>', page)
    assert cell, page
    assert cell.group(1) == f"{qualified}: payments.example did not answer in 30 s"
    shown = re.sub(r"<[^>]+>", "", cell.group(2))
    assert shown == "UpstreamTimeout payments.example did not answer in 30 s"


def test_a_dead_letter_without_a_failure_shows_its_description(
    open_client: TestClient, broker: Broker, queue: str
) -> None:
    broker.sender("orders").send(Message(body=b"{}"))
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(), "InvalidOrder", "no customer")
    page = open_client.get("/ui/deadletters?queue=orders").text
    assert '<td class="clip error" title="no customer">no customer</td>' in page


@pytest.fixture
def many(broker: Broker) -> list[int]:
    """130 dead letters; every third has subject ``refund``. Returns the refunds' numbers."""
    broker.create_queue("orders")
    subjects = ["refund" if n % 3 == 0 else "order" for n in range(130)]
    sent = broker.sender("orders").send(
        [Message(body=str(n), subject=s) for n, s in enumerate(subjects)]
    )
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(max_messages=130), "Broken")
    return [seq for seq, s in zip(sent, subjects, strict=True) if s == "refund"]


@pytest.mark.parametrize("limit", [1, 7, 50])
def test_newest_first_pages_down_through_every_match_once(
    broker: Broker, many: list[int], limit: int
) -> None:
    seen: list[int] = []
    before = None
    while found := newest_dead_letters(broker, "orders", before, limit, {"subject": "refund"}):
        assert len(found) <= limit
        seen += [m.sequence_number for m in found]
        before = found[-1].sequence_number
    assert seen == many[::-1]
    window = {"min_sequence": many[3], "max_sequence": many[-4]}
    found = newest_dead_letters(broker, "orders", None, 100, {"subject": "refund", **window})
    assert [m.sequence_number for m in found] == many[3:-3][::-1]
    assert newest_dead_letters(broker, "orders", many[0], 10, {}) == []


def test_the_explorer_lists_newest_first_on_request(
    open_client: TestClient, many: list[int]
) -> None:
    first = open_client.get("/ui/deadletters?queue=orders&order=newest").text
    assert _rows(first) == list(range(130, 80, -1))
    assert '<strong aria-current="true">✓ newest first</strong>' in first
    following = re.search(r'<a href="([^"]+)">next page', first)
    assert following and "before=81" in following.group(1) and "order=newest" in following.group(1)
    second = open_client.get("/ui/deadletters" + following.group(1).replace("&amp;", "&")).text
    assert _rows(second) == list(range(80, 30, -1))
    # Grouping, filtering and the tabs keep the order.
    assert re.search(r'href="\?queue=orders&amp;by=subject&amp;order=newest"', first)
    assert '<input type="hidden" name="order" value="newest">' in first
    oldest = re.search(r'<a href="([^"]+)">oldest first</a>', first)
    assert (
        oldest
        and _rows(open_client.get("/ui/deadletters" + oldest.group(1).replace("&amp;", "&")).text)[
            0
        ]
        == 1
    )
    assert open_client.get("/ui/deadletters?queue=orders&order=random").status_code == 400


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s ago"),
        (59, "59 s ago"),
        (60, "1 min ago"),
        (299, "4 min ago"),
        (3600, "1 h ago"),
        (86399, "23 h ago"),
        (3 * 86400, "3 d ago"),
        (-300, "in 5 min"),
    ],
)
def test_relative_times(seconds: float, shown: str) -> None:
    assert ago(1_700_000_000 - seconds, 1_700_000_000) == shown


def test_times_are_relative_with_the_exact_time_in_the_title(
    open_client: TestClient, clock: ManualClock, dead: dict[str, list[int]]
) -> None:
    clock.advance(300)
    page = open_client.get("/ui/deadletters?queue=orders").text
    exact = "2023-11-14 22:13:20 UTC"  # the manual clock's start, when the fixture ran
    assert f'<time datetime="2023-11-14T22:13:20Z" title="{exact}">5 min ago</time>' in page
    assert (
        "5 min ago"
        in open_client.get(
            f"/ui/message?address=orders/$deadletterqueue&seq={dead['hostile'][0]}"
        ).text
    )


@pytest.mark.parametrize(
    ("count", "shown"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1229, "1.2 KiB"), (5 * 1024**2, "5.0 MiB")],
)
def test_sizes(count: int, shown: str) -> None:
    assert size(count) == shown


def test_a_binary_body_is_previewed_as_binary(
    open_client: TestClient, broker: Broker, queue: str
) -> None:
    broker.sender("orders").send([Message(body=b"\xff\x00\xfe" * 410), Message(body="café ☕")])
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(max_messages=2), "Broken")
    page = open_client.get("/ui/deadletters?queue=orders").text
    bodies = re.findall(r'<td class="mono clip body" title="([^"]*)">([^<]*)</td>', page)
    assert bodies == [("binary, 1.2 KiB",) * 2, ("café ☕",) * 2]
    assert "\ufffd" not in page
    seq = int(re.findall(r'<a href="message\?address=[^"]+">(\d+)</a>', page)[0])
    message = open_client.get(f"/ui/message?address=orders/$deadletterqueue&seq={seq}").text
    assert "binary (base64), 1.2 KiB</span>" in message


def test_a_resubmitted_fingerprint_is_named_by_its_error_type_in_the_chart(
    open_client: TestClient, broker: Broker, queue: str
) -> None:
    """The chart counts what happened, the groups what is held: a fingerprint whose messages
    were all resubmitted is still in the chart, named by the error type the store kept for
    it, not by a bare key."""
    broker.sender("orders").send(Message(body=b"{}"))
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(), "Failed", error=UpstreamTimeout("no answer"))
    (group,) = broker.dead_letter_groups("orders", "fingerprint")
    broker.resubmit("orders", rate=None)
    page = open_client.get("/ui/deadletters?queue=orders&by=fingerprint").text
    assert f"UpstreamTimeout · {group.key}" in page
