"""A closed native sender or receiver refuses every call: a message a receiver took after
its ``with`` block would stay locked until its lock ran out, held by nothing."""

from __future__ import annotations

import pytest

import poisonq
from poisonq import Message


def test_a_closed_receiver_refuses_every_call_with_a_typed_error(url: str) -> None:
    """After its ``with`` block (or close()), a receiver refuses receive, peek, settling and
    renewing with InvalidOperationError naming the queue, and locks nothing."""
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=b"1"), Message(body=b"2")])
        with broker.receiver("orders") as receiver:
            (held,) = receiver.receive(max_messages=1)
        calls = {
            "receive": lambda: receiver.receive(max_messages=1),
            "peek": lambda: receiver.peek(),
            "complete": lambda: receiver.complete(held),
            "abandon": lambda: receiver.abandon(held),
            "defer": lambda: receiver.defer(held),
            "dead_letter": lambda: receiver.dead_letter(held, "r"),
            "renew_lock": lambda: receiver.renew_lock(held),
            "receive_deferred": lambda: receiver.receive_deferred([held.sequence_number]),
            "complete_and_receive": lambda: receiver.complete_and_receive(held),
        }
        for name, call in calls.items():
            with pytest.raises(poisonq.InvalidOperationError, match=r"orders.*closed"):
                call()
            assert broker.counts("orders")["locked"] == 1, name
        receiver.close()  # closing again does nothing


def test_a_closed_sender_refuses_to_send_with_a_typed_error(url: str) -> None:
    """After its ``with`` block (or close()), a sender refuses send, schedule and
    cancel_scheduled with InvalidOperationError naming the queue; nothing is sent."""
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        with broker.sender("orders") as sender:
            pass
        with pytest.raises(poisonq.InvalidOperationError, match=r"orders.*closed"):
            sender.send([Message(body=b"late")])
        with pytest.raises(poisonq.InvalidOperationError, match=r"orders.*closed"):
            sender.cancel_scheduled([1])
        assert broker.counts("orders")["active"] == 0
        sender.close()
