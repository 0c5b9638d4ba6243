"""``poisonq queue``: every option reaches the store; listings as tables and JSON."""

from __future__ import annotations

from click.testing import CliRunner

from poisonq import Broker, Message
from poisonq.cli import cli
from tests.cli.conftest import assert_one_error_line, run, run_json


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
        "dead_letter_retry": None,
        "per_message_poisoning": False,
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


def test_delete_asks_unless_yes_and_says_how_many_messages_go(
    url: str, api: Broker, orders: str
) -> None:
    """The question and the answer count the messages the queue and its subqueues hold; a
    name that is not there fails before anything is asked."""
    api.sender(orders).send([Message(body=b"x")] * 3)
    receiver = api.receiver(orders)
    receiver.dead_letter(receiver.receive(max_messages=1), reason="Bad")
    refused = run(url, "queue", "delete", orders, code=1, stdin="n\n")
    assert "the 3 message(s) it holds?" in refused.stderr and "Aborted" in refused.stderr
    assert [q.name for q in api.list_queues()] == [orders]
    deleted = run(url, "queue", "delete", orders, "--yes").stdout
    assert "the 3 message(s) it held" in deleted
    assert api.list_queues() == []
    missing = run(url, "queue", "delete", "nothing", code=2, stdin="y\n")
    assert "no queue 'nothing'" in missing.stderr and "Delete" not in missing.stderr


def test_a_table_written_to_a_pipe_keeps_every_column(url: str, orders: str) -> None:
    """A table written to a pipe is not cut to a terminal's width: every column is there,
    with its whole header."""
    piped = CliRunner().invoke(cli, ["--url", url, "queue", "list"], env={"COLUMNS": None})
    assert piped.exit_code == 0, piped.stderr
    header = next(line for line in piped.stdout.splitlines() if "name" in line)
    assert header.split()[-2:] == ["lettered", "completed"]
