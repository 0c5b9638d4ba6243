"""The message a ``map`` transform gets, built from a lease row of either store."""

from __future__ import annotations

from datetime import UTC

import poisonq
from poisonq.spark.schema import lease_batch
from poisonq.store.base import LEASE_COLUMNS
from poisonq.worker.lease_rows import lease_message


def test_a_lease_row_becomes_the_message_dict_with_every_column(broker: poisonq.Broker) -> None:
    broker.create_queue("orders")
    sent = [
        poisonq.Message(
            body=b'{"n": 1}',
            message_id="m-1",
            content_type="application/json",
            subject="order",
            properties={"tenant": "acme", "attempt": 2},
            correlation_id="c-1",
        ),
        poisonq.Message(body=b"plain"),
    ]
    seqs = broker.sender("orders").send(sent)
    lease = broker.acquire_lease("orders", "job", 1, 10)
    assert lease is not None
    first, second = (lease_message(row) for row in broker.lease_rows(lease))
    assert tuple(first) == LEASE_COLUMNS  # the keys, in the store's order
    assert first["sequence_number"] == seqs[0] and first["message_id"] == "m-1"
    assert first["body"] == b'{"n": 1}' and first["subject"] == "order"
    assert first["content_type"] == "application/json" and first["correlation_id"] == "c-1"
    assert first["properties"] == {"tenant": "acme", "attempt": 2}
    assert first["delivery_count"] == 1 and first["session_id"] is None
    assert first["enqueued_time"] == broker.peek("orders")[0].enqueued_time
    assert first["enqueued_time"].tzinfo is UTC
    assert second["properties"] == {} and second["body"] == b"plain"
    # Each message gets its own properties dict: a transform that changes one changes no other.
    first["properties"]["tenant"] = "other"
    assert lease_message(broker.lease_rows(lease)[0])["properties"]["tenant"] == "acme"
    second["properties"]["x"] = 1
    assert lease_message(broker.lease_rows(lease)[1])["properties"] == {}


def test_a_message_without_properties_has_an_empty_map_in_the_lease_batch(
    broker: poisonq.Broker,
) -> None:
    """In the Arrow batch a lease is read as (the ``poisonq`` source, ``map_batches=``), a
    message without properties has an empty map, as a peek reads it, never a null: whether
    no message of the batch has any or only some do."""
    broker.create_queue("orders")
    sender = broker.sender("orders")
    sender.send([poisonq.Message(body=b"a"), poisonq.Message(body=b"b")])
    sender.send([poisonq.Message(body=b"c", properties={"n": 1}), poisonq.Message(body=b"d")])
    lease = broker.acquire_lease("orders", "job", 1, 10)
    assert lease is not None
    rows = broker.lease_rows(lease)
    none_have_any = lease_batch(rows[:2]).column("properties")
    some_have = lease_batch(rows[2:]).column("properties")
    assert none_have_any.null_count == some_have.null_count == 0
    assert none_have_any.to_pylist() == [[], []]
    assert some_have.to_pylist() == [[("n", "1")], []]
