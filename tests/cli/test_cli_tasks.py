"""``poisonq task``: the resubmits and purges of every process, and who ran them."""

from __future__ import annotations

import getpass
import socket

from click.testing import CliRunner

from poisonq import Broker
from poisonq.cli import cli
from poisonq.engine.driving import drive
from poisonq.store.base import MessageFilter
from tests.cli.conftest import assert_one_error_line, run, run_json


def test_the_task_list_names_who_ran_each_task(
    url: str, api: Broker, dead: dict[str, list[int]]
) -> None:
    assert "no pipeline has completed a batch yet" in run(url, "pipeline", "list").stdout
    run(url, "dlq", "purge", "orders", "--reason", "InvalidOrder", "--yes")
    api.create_queue("orders-fixed")
    named = CliRunner().invoke(
        cli,
        ["--url", url, "dlq", "resubmit", "orders", "--rate", "50", "--to", "orders-fixed"],
        env={"POISONQ_OPERATOR": "  night   shift  "},
    )
    assert named.exit_code == 0, named.stderr
    api.purge("orders", started_by="ops-script")  # a program's task, on nothing left
    tasks = run_json(url, "task", "list", "--queue", "orders")
    assert [(t["kind"], t["done"], t["started_by"]) for t in tasks] == [
        ("purge", 0, "ops-script"),
        ("resubmit", 3, "night shift"),
        ("purge", 2, f"{getpass.getuser()}@{socket.gethostname()} (cli)"),
    ]
    assert tasks[1]["spec"]["rate"] == 50.0
    assert tasks[2]["spec"]["where"]["reason"] == "InvalidOrder"
    listed = run(url, "task", "list").stdout
    assert "night shift" in listed and "reason=InvalidOrder" in listed
    assert "at 50/s to orders-fixed" in listed
    assert run_json(url, "task", "list", "--before", str(tasks[1]["id"])) == tasks[2:]
    assert run_json(url, "task", "show", str(tasks[1]["id"]))["started_by"] == "night shift"


def test_a_task_is_cancelled_by_id_and_says_by_whom(url: str, api: Broker, orders: str) -> None:
    running = drive(
        api.engine.start_task("purge", "orders/$deadletterqueue", MessageFilter(), {}, "x")
    )
    cancelled = run_json(url, "task", "cancel", str(running.id))
    assert cancelled["status"] == "cancelled"
    assert cancelled["cancelled_by"].endswith(" (cli)")
    assert "cancelled" in run(url, "task", "show", str(running.id)).stdout
    again = run(url, "task", "cancel", str(running.id)).stdout  # it has ended
    assert "cancelled by " in again and "(cli): 0 of 0 message(s): nothing to cancel" in again


def test_task_mistakes_are_one_line(url: str, orders: str) -> None:
    assert_one_error_line(run(url, "task", "show", "99", code=2), "99")
    assert_one_error_line(run(url, "task", "list", "--queue", "ordres", code=2), "ordres")
    assert_one_error_line(run(url, "task", "list", "--limit", "0", code=2), "--limit")
    assert_one_error_line(run(url, "task", "cancel", "abc", code=2), "ID")
