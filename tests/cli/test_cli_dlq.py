"""``poisonq dlq``: grouping, inspecting, resubmitting and purging dead-lettered messages."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from poisonq import Broker, Message, MessageState
from poisonq.cli import cli
from tests.cli.conftest import DLQ, assert_one_error_line, run, run_json


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


def test_dlq_list_tells_an_empty_subject_from_none(url: str, api: Broker) -> None:
    """A subject that is empty is shown ``""``, apart from the ``(none)`` group of the
    messages without one."""
    api.create_queue("mail")
    api.sender("mail").send([Message(body=b"a", subject=""), Message(body=b"b")])
    receiver = api.receiver("mail")
    receiver.dead_letter(receiver.receive(max_messages=2), reason="Bounced")
    rows = run(url, "dlq", "list", "mail", "--by", "subject").stdout.splitlines()
    assert any(re.search(r'^\W*"" +1 ', row) for row in rows), rows
    assert any(re.search(r"^\W*\(none\) +1 ", row) for row in rows), rows


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


def test_none_selects_the_dead_letters_without_a_value(
    url: str, api: Broker, dead: dict[str, list[int]]
) -> None:
    """``--fingerprint none`` is the "(none)" group of ``dlq list --by fingerprint``."""
    task = run_json(url, "dlq", "purge", "orders", "--fingerprint", "none", "--yes")
    assert (task["total"], task["done"], task["spec"]["where"]["fingerprint"]) == (2, 2, "none")
    left = api.peek(DLQ, max_messages=10)
    assert sorted(m.sequence_number for m in left) == dead["MaxDeliveryCountExceeded"]


def test_a_resubmit_or_purge_that_matches_nothing_shows_what_there_is(
    url: str, api: Broker, dead: dict[str, list[int]]
) -> None:
    nothing = run(url, "dlq", "resubmit", "orders", "--reason", "Nope", "--json", code=1)
    first, *table = nothing.stderr.splitlines()
    assert first == (
        "nothing to resubmit: no dead letter of 'orders' matches reason=Nope; they are, by reason:"
    )
    shown = "\n".join(table)
    assert re.search(r"MaxDeliveryCountExceeded +3 ", shown)
    assert re.search(r"InvalidOrder +2 ", shown)
    assert nothing.stdout == ""
    by_fingerprint = run(url, "dlq", "purge", "orders", "--fingerprint", "f00d", "--yes", code=1)
    assert "by fingerprint:" in by_fingerprint.stderr and "KeyError" in by_fingerprint.stderr
    by_subject = run(url, "dlq", "purge", "orders", "--subject", "none", code=1)
    assert re.search(r"order +3 ", by_subject.stderr) and "Drop" not in by_subject.stderr
    assert api.counts("orders")["dead_lettered"] == 5 and api.counts(DLQ)["dropped"] == 0
    run(url, "dlq", "purge", "orders", "--yes")
    empty = run(url, "dlq", "resubmit", "orders", code=1)
    assert empty.stderr == "nothing to resubmit: the dead-letter queue of 'orders' is empty\n"


def test_dlq_time_filters(url: str, dead: dict[str, list[int]]) -> None:
    future = run(url, "dlq", "purge", "orders", "--since", "2999-01-01", "--yes", code=1)
    assert "matches since=2999-01-01 00:00:00" in future.stderr
    backwards = ("--since", "2999-01-02", "--until", "2999-01-01", "--yes")
    empty = run(url, "dlq", "purge", "orders", *backwards, code=2)
    assert_one_error_line(empty, "until must be later than since (the range is empty)")
    past = run_json(url, "dlq", "purge", "orders", "--until", "2999-01-01", "--yes")
    assert past["done"] == 5


def test_dlq_search_filters(url: str, api: Broker, dead: dict[str, list[int]]) -> None:
    one = run_json(url, "dlq", "purge", "orders", "--body-contains", "i1", "--yes")
    assert one["done"] == 1
    [left] = api.dead_letters("orders", reason="InvalidOrder")
    moved = run_json(url, "dlq", "resubmit", "orders", "--message-id", left.message_id)
    assert moved["done"] == 1 and api.counts("orders")["active"] == 1


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
    # A shell's background job starts with Ctrl-C ignored, and its children inherit that.
    ctrl_c = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    with subprocess.Popen(
        slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c
    ) as process:
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
