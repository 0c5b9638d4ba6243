"""The ``poisonq`` command line, run in-process with click's runner against real SQLite files.

Messages are dead-lettered through the Python API (as a failing consumer would) and then
inspected and resubmitted through the CLI, as an operator on call would.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import poisonq
from poisonq import Broker, Message, MessageState
from poisonq.cli import cli

DLQ = "orders/$deadletterqueue"


def run(url: str, *args: str, code: int = 0, stdin: str | bytes | None = None) -> Result:
    """Run ``poisonq --url URL ARGS`` on a wide terminal and check its exit code."""
    result = CliRunner().invoke(cli, ["--url", url, *args], input=stdin, env={"COLUMNS": "200"})
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def run_json(url: str, *args: str) -> Any:
    return json.loads(run(url, *args, "--json").stdout)


def assert_one_error_line(result: Result, *fragments: str) -> None:
    """A PoisonqError is one ``error:`` line on stderr: no traceback, nothing on stdout."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert all(fragment in lines[0] for fragment in fragments), lines[0]
    assert result.stdout == ""


@pytest.fixture
def api(url: str) -> Iterator[Broker]:
    """A broker on the CLI's store with the real clock (the CLI has no other)."""
    with poisonq.connect(url) as broker:
        yield broker


@pytest.fixture
def orders(api: Broker) -> str:
    api.create_queue("orders", max_delivery_count=2, lock_duration=30)
    return "orders"


def _find_customer(customer: str) -> None:
    raise KeyError(customer)


def _fail(broker: Broker, count: int) -> None:
    """Receive ``count`` messages and abandon them with a raised KeyError until they are
    poisoned (two deliveries), as a consumer whose lookup fails would."""
    receiver = broker.receiver("orders")
    for _ in range(2):
        try:
            _find_customer("cust-17")
        except KeyError as exc:
            receiver.abandon(receiver.receive(max_messages=count), error=exc)


@pytest.fixture
def dead(api: Broker, orders: str) -> dict[str, list[int]]:
    """Dead-lettered messages of ``orders``: three poisoned by a KeyError (subject ``order``)
    and two dead-lettered by the application as ``InvalidOrder`` (subject ``refund``)."""
    sender = api.sender(orders)
    poisoned = sender.send([Message(body=f"p{n}", subject="order") for n in range(3)])
    _fail(api, 3)
    invalid = sender.send([Message(body=f"i{n}", subject="refund") for n in range(2)])
    receiver = api.receiver(orders)
    receiver.dead_letter(receiver.receive(max_messages=2), "InvalidOrder", "no customer")
    return {"MaxDeliveryCountExceeded": poisoned, "InvalidOrder": invalid}


# Help and errors ---------------------------------------------------------------------------
def _commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_command_has_help(url: str) -> None:
    commands = dict(_commands(cli))
    assert {("dlq", "resubmit"), ("queue", "create"), ("send",), ("demo",)} <= set(commands)
    for path, command in commands.items():
        assert command.help, path
        shown = run(url, *path, "--help").stdout
        assert shown.startswith("Usage: ") and command.help.split()[0] in shown, path
        for option in command.params:
            if isinstance(option, click.Option) and option.name not in ("help", "version"):
                assert option.help, (path, option.name)


def test_an_unknown_queue_is_one_error_line_with_exit_code_2(url: str) -> None:
    for args in (["queue", "show", "nope"], ["peek", "nope"], ["dlq", "list", "nope"]):
        assert_one_error_line(run(url, *args, code=2), "'nope", "does not exist")


def test_an_invalid_option_is_one_error_line(url: str) -> None:
    result = run(url, "queue", "create", "orders", "--lock-duration", "900", code=2)
    assert_one_error_line(result, "lock_duration")


def test_the_url_comes_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(cli, ["queue", "create", "q"], env={"POISONQ_URL": url})
    assert result.exit_code == 0, result.stderr
    with poisonq.connect(url) as broker:
        assert [q.name for q in broker.list_queues()] == ["q"]


# Queues ------------------------------------------------------------------------------------
def test_queue_create_maps_every_option(url: str) -> None:
    created = run_json(
        url,
        *("queue", "create", "orders", "--max-delivery-count", "5", "--lock-duration", "30"),
        *("--default-message-ttl", "3600", "--requires-duplicate-detection"),
        *("--duplicate-detection-window", "120", "--max-message-size", "1000"),
        *("--max-properties-size", "500", "--max-size", "100000"),
        *("--no-dead-lettering-on-message-expiration", "--auto-disable-after-rollbacks", "4"),
    )
    assert created["name"] == "orders" and created["status"] == "active"
    assert created["options"] | {"retry": None} == {
        "max_delivery_count": 5,
        "lock_duration": 30.0,
        "default_message_ttl": 3600.0,
        "dead_lettering_on_message_expiration": False,
        "requires_duplicate_detection": True,
        "duplicate_detection_window": 120.0,
        "requires_session": False,
        "forward_to": None,
        "forward_dead_lettered_messages_to": None,
        "max_message_size": 1000,
        "max_properties_size": 500,
        "max_size": 100000,
        "auto_disable_after_rollbacks": 4,
        "retry": None,
    }
    assert created["options"]["retry"]["receive_retry_count"] == 4


def test_queue_list_and_show(url: str, api: Broker, orders: str) -> None:
    api.sender(orders).send([Message(body=b"a"), Message(body=b"b")])
    api.create_queue("payments")
    listed = run_json(url, "queue", "list")
    assert [(q["name"], q["counts"]["active"]) for q in listed] == [("orders", 2), ("payments", 0)]
    table = run(url, "queue", "list").stdout
    assert "orders" in table and "payments" in table and "dead lettered" in table
    shown = run_json(url, "queue", "show", orders)
    assert shown["options"]["max_delivery_count"] == 2
    assert shown["counts"]["active"] == 2 and shown["ledger"]["sent"] == 2
    detail = run(url, "queue", "show", orders).stdout
    assert "lock_duration" in detail and "retry.receive_retry_count" in detail


def test_queue_update_changes_only_what_is_given(url: str, orders: str) -> None:
    run(url, "queue", "update", orders, "--default-message-ttl", "60")
    updated = run_json(url, "queue", "update", orders, "--max-delivery-count", "7")
    assert updated["options"]["max_delivery_count"] == 7
    assert updated["options"]["default_message_ttl"] == 60.0
    assert updated["options"]["lock_duration"] == 30.0
    never = run_json(url, "queue", "update", orders, "--default-message-ttl", "never")
    assert never["options"]["default_message_ttl"] is None
    assert "at least one option" in run(url, "queue", "update", orders, code=2).stderr


def test_disable_and_enable(url: str, orders: str) -> None:
    assert "disabled" in run(url, "queue", "disable", orders).stdout
    assert_one_error_line(run(url, "send", orders, "x", code=2), "disabled")
    run(url, "queue", "enable", orders)
    assert run_json(url, "send", orders, "x")["sent"] == 1


def test_delete_asks_unless_yes(url: str, api: Broker, orders: str) -> None:
    refused = run(url, "queue", "delete", orders, code=1, stdin="n\n")
    assert "Aborted" in refused.stderr
    assert [q.name for q in api.list_queues()] == [orders]
    run(url, "queue", "delete", orders, "--yes")
    assert api.list_queues() == []


# Sending -----------------------------------------------------------------------------------
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


def test_bodies_are_shown_as_text_never_as_markup(url: str, api: Broker, orders: str) -> None:
    api.sender(orders).send([Message(body=b"[bold red]x[/]"), Message(body=b"\xff\xfe")])
    assert "[bold red]x[/]" in run(url, "peek", orders).stdout
    markup, binary = run_json(url, "peek", orders)
    assert markup["body_encoding"] == "utf-8"
    assert (binary["body"], binary["body_encoding"]) == ("//4=", "base64")


# The dead-letter queue ---------------------------------------------------------------------
def test_dlq_list_groups(url: str, dead: dict[str, list[int]]) -> None:
    by_reason = run_json(url, "dlq", "list", "orders")
    assert {g["key"]: g["count"] for g in by_reason} == {
        "MaxDeliveryCountExceeded": 3,
        "InvalidOrder": 2,
    }
    by_subject = run_json(url, "dlq", "list", "orders", "--by", "subject")
    assert {g["key"]: g["count"] for g in by_subject} == {"order": 3, "refund": 2}
    by_fingerprint = run_json(url, "dlq", "list", "orders", "--by", "fingerprint")
    assert {g["label"]: g["count"] for g in by_fingerprint} == {"KeyError": 3, None: 2}
    table = run(url, "dlq", "list", "orders", "--by", "fingerprint").stdout
    fingerprint = next(g["key"] for g in by_fingerprint if g["label"] == "KeyError")
    assert fingerprint in table and "(none)" in table and "error type" in table


def test_dlq_show_has_every_field_and_the_failure_history(
    url: str, dead: dict[str, list[int]]
) -> None:
    seq = dead["MaxDeliveryCountExceeded"][0]
    shown = run_json(url, "dlq", "show", "orders", str(seq))
    assert shown["sequence_number"] == seq and shown["state"] == "dead_lettered"
    assert shown["dead_letter_reason"] == "MaxDeliveryCountExceeded"
    assert shown["dead_letter_error_description"] == "KeyError: 'cust-17'"
    assert shown["delivery_count"] == 2 and shown["body"] == "p0"
    assert [f["error_type"] for f in shown["failures"]] == ["KeyError", "KeyError"]
    assert all(f["fingerprint"] and f["traceback"] for f in shown["failures"])
    detail = run(url, "dlq", "show", "orders", str(seq)).stdout
    assert "dead_letter_reason" in detail and "failure 2: KeyError" in detail
    assert "Traceback (most recent call last)" in detail
    assert_one_error_line(run(url, "dlq", "show", "orders", "999", code=2), "999")


def test_dlq_resubmit_with_filters(url: str, api: Broker, dead: dict[str, list[int]]) -> None:
    task = run_json(url, "dlq", "resubmit", "orders", "--reason", "InvalidOrder", "--rate", "0")
    assert (task["kind"], task["status"], task["done"], task["total"]) == (
        "resubmit",
        "completed",
        2,
        2,
    )
    assert api.counts("orders")["active"] == 2
    first = dead["MaxDeliveryCountExceeded"][0]
    result = run(url, "dlq", "resubmit", "orders", "--max-sequence", str(first), "--rate", "100")
    assert "1 of 1 message(s)" in result.stdout
    back = api.peek("orders", max_messages=10)
    assert sorted(m.text for m in back) == ["i0", "i1", "p0"]
    assert all(m.state is MessageState.ACTIVE and m.delivery_count == 0 for m in back)
    assert api.counts("orders")["dead_lettered"] == 2


def test_dlq_resubmit_to_another_queue(url: str, api: Broker, dead: dict[str, list[int]]) -> None:
    api.create_queue("retries")
    run(url, "dlq", "resubmit", "orders", "--subject", "refund", "--to", "retries")
    assert api.counts("retries")["active"] == 2


def test_dlq_purge(url: str, api: Broker, dead: dict[str, list[int]]) -> None:
    fingerprint = api.peek(DLQ)[0].failures[0].fingerprint
    run(url, "dlq", "purge", "orders", "--fingerprint", fingerprint, code=1, stdin="n\n")
    assert api.counts("orders")["dead_lettered"] == 5
    task = run_json(url, "dlq", "purge", "orders", "--fingerprint", fingerprint, "--yes")
    assert task["done"] == 3
    assert {m.dead_letter_reason for m in api.peek(DLQ, max_messages=10)} == {"InvalidOrder"}
    run(url, "dlq", "purge", "orders", stdin="y\n")
    counts = api.counts("orders")
    assert (counts["dead_lettered"], counts["dropped"]) == (0, 0)
    assert api.counts(DLQ)["dropped"] == 5
    assert api.audit().ok


def test_dlq_time_filters(url: str, dead: dict[str, list[int]]) -> None:
    future = run_json(url, "dlq", "purge", "orders", "--since", "2999-01-01", "--yes")
    assert future["total"] == 0
    past = run_json(url, "dlq", "purge", "orders", "--until", "2999-01-01", "--yes")
    assert past["done"] == 5


def test_progress_goes_to_stderr_on_a_terminal(url: str, dead: dict[str, list[int]]) -> None:
    terminal = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "0", "COLUMNS": "200"}
    result = CliRunner().invoke(
        cli, ["--url", url, "dlq", "resubmit", "orders", "--json"], env=terminal
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["done"] == 5
    assert "resubmitting from orders" in result.stderr and "5/5" in result.stderr


def test_ctrl_c_cancels_a_resubmit_and_keeps_what_moved(url: str, api: Broker) -> None:
    api.create_queue("orders", max_delivery_count=1)
    api.sender("orders").send([Message(body=f"m{n}") for n in range(200)])
    receiver = api.receiver("orders")
    receiver.dead_letter(receiver.receive(max_messages=200), "Broken")
    command = [sys.executable, "-c", "from poisonq.cli import main; main()", "--url", url]
    slow = [*command, "dlq", "resubmit", "orders", "--rate", "20", "--json"]
    with subprocess.Popen(slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 30
        while api.counts("orders")["active"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    task = json.loads(stdout)
    assert task["status"] == "cancelled" and 0 < task["done"] < 200
    counts = api.counts("orders")
    assert counts["active"] == task["done"] and counts["dead_lettered"] == 200 - task["done"]
    assert api.audit().ok


# Audit and demo ----------------------------------------------------------------------------
def test_audit_passes_then_fails_when_a_message_vanishes(
    url: str, api: Broker, orders: str, tmp_path: Path
) -> None:
    api.sender(orders).send([Message(body=b"a"), Message(body=b"b")])
    report = run_json(url, "audit")
    assert report["ok"] is True and report["sent"] == 2 and report["held"] == 2
    assert "balanced" in run(url, "audit").stdout
    # A message lost behind the library's back: the ledger no longer balances.
    with sqlite3.connect(tmp_path / "queues.db") as db:
        db.execute("DELETE FROM messages WHERE seq = (SELECT min(seq) FROM messages)")
    failing = run(url, "audit", "--json", code=1)
    assert json.loads(failing.stdout)["ok"] is False
    assert "OUT OF BALANCE" in run(url, "audit", code=1).stdout


def test_demo_checks_every_order(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--orders", "2000", "--dir", str(directory)])
    assert result.exit_code == 0, (result.stdout, result.exception)
    assert "✗" not in result.stdout and result.stdout.count("✓") == 5
    assert "dlq list orders --by fingerprint" in result.stdout
    with poisonq.connect(f"sqlite:///{directory / 'demo.db'}") as broker:
        groups = {g.key: g.count for g in broker.dead_letter_groups("orders")}
        assert groups == {
            "UnknownCustomerError": 20,
            "MaxDeliveryCountExceeded": 10,
            "TTLExpiredException": 10,
        }
        assert broker.counts("orders")["completed"] == 1960
