"""``poisonq send``, ``receive`` and ``peek`` against a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from poisonq import Broker, Message
from tests.cli.conftest import DLQ, assert_one_error_line, run, run_json


def test_send_bodies_with_options(url: str, api: Broker, orders: str) -> None:
    sent = run_json(
        url,
        *("send", orders, '{"id": 1}', "second", "--subject", "order", "--ttl", "600"),
        *("--property", "region=eu", "--property", "n=3", "--property", "vip=true"),
    )
    assert sent["sent"] == 2 and len(sent["sequence_numbers"]) == 2
    first, second = api.peek(orders, max_messages=10)
    assert (first.body, second.body) == (b'{"id": 1}', b"second")
    assert first.subject == "order"
    assert first.properties == {"region": "eu", "n": 3, "vip": True}
    assert first.expires_at is not None
    assert "sent 1 message(s) to orders" in run(url, "send", orders, "x").stdout


def test_send_with_a_message_id_needs_exactly_one_body(url: str, api: Broker, orders: str) -> None:
    run(url, "send", orders, "x", "--message-id", "o-1")
    assert [m.message_id for m in api.peek(orders)] == ["o-1"]
    assert (
        "exactly one BODY" in run(url, "send", orders, "a", "b", "--message-id", "o", code=2).stderr
    )
    assert "not both or neither" in run(url, "send", orders, code=2).stderr


def _jsonl(*lines: Any) -> str:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


def test_send_json_lines_from_a_file(url: str, api: Broker, orders: str, tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    path.write_text(
        _jsonl(
            {"body": "plain text", "message_id": "o-1", "subject": "note"},
            "",
            {"body": {"id": 2, "items": [1, 2]}, "properties": {"region": "us"}},
            {"body": [1, 2, 3], "time_to_live": 60, "content_type": "text/x-list"},
        )
    )
    sent = run_json(url, "send", orders, "--file", str(path), "--property", "source=file")
    assert sent["sent"] == 3
    text, obj, array = api.peek(orders, max_messages=10)
    assert (text.body, text.message_id, text.subject) == (b"plain text", "o-1", "note")
    assert json.loads(obj.body) == {"id": 2, "items": [1, 2]}
    assert obj.properties == {"source": "file", "region": "us"}
    assert text.properties == {"source": "file"}
    assert array.body == b"[1, 2, 3]" and array.content_type == "text/x-list"
    assert array.expires_at is not None


def test_send_json_lines_from_stdin_in_batches(url: str, api: Broker, orders: str) -> None:
    lines = _jsonl(*({"body": f"m{n}"} for n in range(1200)))
    result = run(url, "send", orders, "--file", "-", "--batch-size", "500", stdin=lines)
    assert "sent 1200 message(s)" in result.stdout
    assert api.counts(orders)["active"] == 1200


def test_a_bad_line_names_its_number_and_sends_nothing_of_its_batch(
    url: str, api: Broker, orders: str
) -> None:
    bad_json = _jsonl({"body": "a"}, '{"body": "b"', {"body": "c"})
    assert_one_error_line(run(url, "send", orders, "--file", "-", code=2, stdin=bad_json), "line 2")
    assert api.counts(orders)["active"] == 0
    for line, why in (
        ({"subject": "no body"}, '"body"'),
        ({"body": "x", "colour": "red"}, "colour"),
        ({"body": "x", "properties": {"a": [1]}}, '"properties"'),
        ({"body": "x", "time_to_live": -1}, '"time_to_live"'),
        ({"body": "x", "subject": 5}, '"subject"'),
    ):
        result = run(url, "send", orders, "--file", "-", code=2, stdin=_jsonl(line))
        assert_one_error_line(result, "line 1", why)
    later = _jsonl({"body": "a"}, {"body": "b"}, "not json")
    result = run(url, "send", orders, "--file", "-", "--batch-size", "2", code=2, stdin=later)
    assert_one_error_line(result, "line 3", "2 message(s) of earlier batches were sent")
    assert api.counts(orders)["active"] == 2


# Receiving and peeking ---------------------------------------------------------------------
def test_receive_completes_by_default(url: str, api: Broker, orders: str) -> None:
    api.sender(orders).send([Message(body=f"m{n}", message_id=f"id-{n}") for n in range(3)])
    got = run_json(url, "receive", orders, "--max", "2")
    assert [m["message_id"] for m in got] == ["id-0", "id-1"]
    assert got[0]["body"] == "m0" and got[0]["delivery_count"] == 1
    assert api.counts(orders)["completed"] == 2
    table = run(url, "receive", orders).stdout
    assert "id-2" in table and "m2" in table
    assert run_json(url, "receive", orders) == []


@pytest.mark.parametrize(
    ("settle", "state"), [("abandon", "active"), ("defer", "deferred"), ("none", "locked")]
)
def test_receive_with_another_settlement(
    url: str, api: Broker, orders: str, settle: str, state: str
) -> None:
    api.sender(orders).send(Message(body=b"x"))
    run(url, "receive", orders, "--settle", settle)
    counts = api.counts(orders)
    assert counts[state] == 1 and counts["completed"] == 0


def test_receive_and_delete(url: str, api: Broker, orders: str) -> None:
    api.sender(orders).send(Message(body=b"x"))
    got = run_json(url, "receive", orders, "--mode", "receive-and-delete")
    assert got[0]["lock_token"] is None
    assert api.counts(orders)["completed"] == 1
    refused = run(
        url, "receive", orders, "--mode", "receive-and-delete", "--settle", "abandon", code=2
    )
    assert "cannot be settled" in refused.stderr


def test_peek_pages_by_sequence_number(url: str, api: Broker, orders: str) -> None:
    seqs = api.sender(orders).send([Message(body=f"m{n}") for n in range(5)])
    page = run_json(url, "peek", orders, "--max", "2", "--from-sequence", str(seqs[2]))
    assert [m["sequence_number"] for m in page] == seqs[2:4]
    assert all(m["delivery_count"] == 0 and m["state"] == "active" for m in page)
    assert api.counts(orders)["active"] == 5


def test_peek_takes_the_dead_letter_filters(
    url: str, api: Broker, dead: dict[str, list[int]]
) -> None:
    def seqs(*args: str) -> list[int]:
        return [m["sequence_number"] for m in run_json(url, "peek", DLQ, *args)]

    assert seqs("--reason", "InvalidOrder") == dead["InvalidOrder"]
    assert seqs("--fingerprint", "none") == dead["InvalidOrder"]
    assert (
        seqs("--subject", "order", "--reason", "MaxDeliveryCountExceeded", "--max", "2")
        == (dead["MaxDeliveryCountExceeded"][:2])
    )
    assert seqs("--subject", "none") == []
    api.sender("orders").send(Message(body="fresh", subject="order"))
    assert [m["body"] for m in run_json(url, "peek", "orders", "--subject", "order")] == ["fresh"]
    assert run_json(url, "peek", "orders", "--reason", "none")[0]["body"] == "fresh"


def test_bodies_are_shown_as_text_never_as_markup(url: str, api: Broker, orders: str) -> None:
    api.sender(orders).send([Message(body=b"[bold red]x[/]"), Message(body=b"\xff\xfe")])
    assert "[bold red]x[/]" in run(url, "peek", orders).stdout
    markup, binary = run_json(url, "peek", orders)
    assert markup["body_encoding"] == "utf-8"
    assert (binary["body"], binary["body_encoding"]) == ("//4=", "base64")
