"""What the CLI tests share: running ``poisonq`` in-process with click's runner against each
store (the parametrized ``url`` fixture: a SQLite file, a PostgreSQL database), and queues
whose messages were dead-lettered through the Python API (as a failing consumer would) for the
CLI to inspect, as an operator on call would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import poisonq
from poisonq import Broker, Message
from poisonq.cli import cli

DLQ = "orders/$deadletterqueue"


def all_commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and group under ``group``, with the words that call it."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from all_commands(command, (*path, name))


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
