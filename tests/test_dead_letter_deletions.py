"""Every way a message leaves a dead-letter queue counts it out of the queue's kept groups in
the same transaction: on SQLite the store does it for each deletion (messages have no delete
trigger since schema 15), on PostgreSQL its statement triggers."""

from __future__ import annotations

from poisonq import Broker, Message
from tests.helpers import assert_balanced


def _groups(broker: Broker) -> dict[str | None, int]:
    return {group.key: group.count for group in broker.dead_letter_groups("orders", by="reason")}


def _dead_letter(broker: Broker, reasons: list[str]) -> None:
    broker.sender("orders").send([Message(body=reason.encode()) for reason in reasons])
    receiver = broker.receiver("orders")
    for message, reason in zip(receiver.receive(max_messages=len(reasons)), reasons, strict=True):
        receiver.dead_letter(message, reason)


def test_a_receive_and_delete_and_a_completed_lease_count_dead_letters_out_of_their_groups(
    broker: Broker,
) -> None:
    """A receive-and-delete from a dead-letter queue and a lease over it, completed as one
    range, each leave the groups equal to a recount; deleting the queue leaves no group and
    no message behind."""
    broker.create_queue("orders")
    _dead_letter(broker, ["A", "A", "B", "B", "C"])
    deleting = broker.receiver("orders;poison", receive_mode="receive_and_delete")
    [taken] = deleting.receive(max_messages=1)
    assert taken.dead_letter_reason == "A"
    assert _groups(broker) == {"A": 1, "B": 2, "C": 1}
    lease = broker.acquire_lease("orders;poison", "spark", 1, max_messages=3)
    assert lease is not None and lease.count == 3
    assert broker.complete_lease(lease) == 3
    assert _groups(broker) == {"C": 1}
    assert all(entry.aggregates_match for entry in broker.audit().entries)
    assert_balanced(broker)
    broker.delete_queue("orders")
    broker.create_queue("orders")
    assert _groups(broker) == {}
    assert broker.audit().ok
