"""The command line for retry policies, faults, auto-disable, sessions, forwarding, topics."""

from __future__ import annotations

from poisonq import Broker, Message
from tests.cli.conftest import assert_one_error_line, run, run_json


def test_queue_create_takes_the_retry_policy_sessions_and_forwarding(url: str) -> None:
    run(url, "queue", "create", "archive")
    created = run_json(
        url,
        *("queue", "create", "orders", "--receive-retry-count", "2", "--max-retry-cycles", "1"),
        *("--retry-cycle-delay", "60", "--receive-error-handling", "fault"),
        *("--requires-session", "--forward-dead-lettered-messages-to", "archive"),
    )
    retry = created["options"]["retry"]
    assert (retry["receive_retry_count"], retry["max_retry_cycles"]) == (2, 1)
    assert (retry["retry_cycle_delay"], retry["receive_error_handling"]) == (60.0, "fault")
    assert created["options"]["requires_session"] is True
    assert created["options"]["forward_dead_lettered_messages_to"] == "archive"
    updated = run_json(url, "queue", "update", "orders", "--max-delivery-count", "5")
    assert updated["options"]["retry"]["receive_error_handling"] == "fault"
    assert updated["options"]["retry"]["receive_retry_count"] == 4


def test_queue_show_reports_a_fault_and_queue_resolve_ends_it(url: str, api: Broker) -> None:
    run(url, "queue", "create", "orders", "--max-delivery-count", "1",
        "--receive-error-handling", "fault")  # fmt: skip
    (seq,) = api.sender("orders").send(Message(body=b"bad"))
    receiver = api.receiver("orders")
    receiver.abandon(receiver.receive(), error=KeyError("cust-17"))
    shown = run_json(url, "queue", "show", "orders")
    assert shown["status"] == "receive_disabled"
    assert shown["event"]["kind"] == "fault" and shown["event"]["sequence_number"] == seq
    assert f"poison message {seq}" in run(url, "queue", "show", "orders").stdout
    refused = run(url, "receive", "orders", code=2)
    assert_one_error_line(refused, f"poison message {seq}")
    resolved = run_json(url, "queue", "resolve", "orders", str(seq), "--action", "drop")
    assert resolved["status"] == "active" and resolved["counts"]["dropped"] == 1


def test_queue_show_reports_an_auto_disable(url: str, api: Broker) -> None:
    run(url, "queue", "create", "orders", "--auto-disable-after-rollbacks", "1")
    api.sender("orders").send(Message(body=b"x"))
    receiver = api.receiver("orders")
    receiver.abandon(receiver.receive())
    shown = run_json(url, "queue", "show", "orders")
    assert shown["event"]["kind"] == "auto_disabled" and shown["event"]["rollbacks"] == 1
    run(url, "queue", "enable", "orders")
    assert run_json(url, "queue", "show", "orders")["status"] == "active"


def test_topic_create_and_subscribe_with_filters(url: str, api: Broker) -> None:
    assert run_json(url, "topic", "create", "events")["kind"] == "topic"
    sub = run_json(url, "topic", "subscribe", "events", "eu", "--filter", "region = 'eu'")
    assert sub["name"] == "events/subscriptions/eu" and sub["filter"] == {"sql": "region = 'eu'"}
    run(url, "topic", "subscribe", "events", "orders", "--correlation", "sys.subject=order")
    run(url, "send", "events", "x", "--subject", "order", "--property", "region=eu")
    run(url, "send", "events", "y", "--property", "region=us")
    assert api.counts("events/subscriptions/eu")["active"] == 1
    assert api.counts("events/subscriptions/orders")["active"] == 1
    bad = run(url, "topic", "subscribe", "events", "bad", "--filter", "region = = 1", code=2)
    assert_one_error_line(bad, "invalid filter")


def test_dlq_list_and_show_read_the_namespace_dead_letter_queue(url: str, api: Broker) -> None:
    run(url, "queue", "create", "orders", "--max-delivery-count", "1",
        "--receive-error-handling", "reject")  # fmt: skip
    (seq,) = api.sender("orders").send(Message(body=b"bad"))
    receiver = api.receiver("orders")
    receiver.abandon(receiver.receive())
    [group] = run_json(url, "dlq", "list", "$deadletterqueue")
    assert (group["key"], group["count"]) == ("Rejected", 1)
    shown = run_json(url, "dlq", "show", "$deadletterqueue", str(seq))
    assert shown["dead_letter_source"] == "orders"


def test_send_and_receive_by_session_on_a_session_queue(url: str, api: Broker) -> None:
    run(url, "queue", "create", "orders", "--requires-session")
    run(url, "send", "orders", "a1", "a2", "--session-id", "alice", "--reply-to", "shop")
    run(url, "send", "orders", "b1", "--session-id", "bob")
    refused = run(url, "receive", "orders", code=2)
    assert_one_error_line(refused, "requires sessions")
    alice = run_json(url, "receive", "orders", "--session", "alice", "--max", "5")
    assert [m["body"] for m in alice] == ["a1", "a2"]  # in order, completed
    assert {m["session_id"] for m in alice} == {"alice"} and alice[0]["reply_to"] == "shop"
    [bob] = run_json(url, "receive", "orders", "--next-session", "--max", "5")
    assert bob["body"] == "b1"
    assert run_json(url, "receive", "orders", "--next-session") == []  # none left
    run(url, "receive", "orders", "--session", "x", "--next-session", code=2)
    assert api.counts("orders")["completed"] == 3
