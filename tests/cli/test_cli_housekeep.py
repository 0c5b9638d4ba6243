"""``poisonq housekeep``: one pass that applies what is due on the store's clock to every
entity, and its loop (``--every``, and the one ``poisonq serve`` runs)."""

from __future__ import annotations

import json
import threading

import poisonq
from poisonq import Broker, ManualClock, Message
from poisonq.cli.housekeeping import keep_time
from tests.cli.conftest import run, run_json
from tests.helpers import assert_balanced, execute_behind_the_back


def test_housekeep_applies_what_is_due_and_names_where(url: str, api: Broker, orders: str) -> None:
    """The CLI has the real clock: an hour passes for the message as its expiry moves back."""
    api.sender(orders).send([Message(body=b"a", time_to_live=60), Message(body=b"b")])
    assert "nothing was due" in run(url, "housekeep").stdout
    execute_behind_the_back(url, "UPDATE messages SET expires_at = expires_at - 3600")
    assert run_json(url, "housekeep") == {"applied": [orders]}
    assert json.loads(run(url, "housekeep", "--json").stdout) == {"applied": []}
    assert api.count_dead_letters(orders) == 1
    assert_balanced(api)


def test_housekeep_refuses_a_period_that_is_not_positive(url: str) -> None:
    result = run(url, "housekeep", "--every", "0", code=2)
    assert "--every" in result.stderr


def test_the_loop_runs_a_pass_at_each_period_until_stopped(url: str, clock: ManualClock) -> None:
    """What ``poisonq housekeep --every`` and the server's thread run: a pass, a wait, until
    the stop is set; each pass reports where something was due."""
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders", max_delivery_count=1, lock_duration=5)
        broker.sender("orders").send(Message(body=b"x"))
        broker.receiver("orders").receive()
        stop = threading.Event()
        passes: list[list[str]] = []

        def report(names: list[str]) -> None:
            passes.append(names)
            clock.advance(5)  # the time between two passes
            if len(passes) == 3:
                stop.set()

        keep_time(broker, 0, stop, report)
        assert passes == [[], ["orders"], []]
        assert broker.count_dead_letters("orders") == 1
        assert_balanced(broker)
