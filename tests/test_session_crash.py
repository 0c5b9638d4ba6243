"""A process killed (SIGKILL) while it holds a session: once the session lock runs out,
another receiver gets the whole session, in order, and the deliveries the dead process had
count (an expired lock is a delivery, as in Service Bus). Runs on both stores.

The victim is a separate interpreter started with ``spawn`` on the real clock; the parent
reads the store on a manual clock started at the real time and moves it past the lock.
"""

from __future__ import annotations

import time
from multiprocessing.synchronize import Event

import pytest

import poisonq
from poisonq import ManualClock, Message
from tests.helpers import SPAWN, START_TIMEOUT, assert_balanced, kill_while_holding

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LOCK = 5.0


def _hold_session(url: str, holding: Event) -> None:
    """Accept session ``a``, lock three of its messages, say so, and hang until killed."""
    with poisonq.connect(url) as broker:
        session = broker.accept_session("orders", "a")
        session.receive(max_messages=3)
        holding.set()
        time.sleep(START_TIMEOUT)


def test_a_session_held_by_a_killed_process_comes_back_whole_after_its_lock(url: str) -> None:
    clock = ManualClock(time.time())
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders", requires_session=True, lock_duration=LOCK)
        broker.sender("orders").send([Message(body=f"a{n}", session_id="a") for n in range(5)])
        holding = SPAWN.Event()
        victim = SPAWN.Process(target=_hold_session, args=(url, holding))
        kill_while_holding(victim, holding)  # it holds the session and 3 locks
        assert broker.accept_next_session("orders", max_wait=0) is None  # still held
        clock.advance(time.time() - clock.now() + LOCK + 1)
        session = broker.accept_next_session("orders", max_wait=0)
        assert session is not None and session.session_id == "a"
        with session:
            got = session.receive(max_messages=10)
            assert [m.text for m in got] == [f"a{n}" for n in range(5)]
            assert [m.delivery_count for m in got] == [2, 2, 2, 1, 1]
            session.complete(got)
        assert broker.counts("orders")["completed"] == 5
        assert_balanced(broker)
