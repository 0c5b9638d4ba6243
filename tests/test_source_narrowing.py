"""The rules a plain streaming query's replays follow (poisonq/spark/narrowing.py), on the
store without Spark: what a replay keeps, how the leases after it are sized, and which
redelivered message gets a batch of its own. The source applies them on every planning;
tests/test_source_restarts.py runs them through real queries."""

from __future__ import annotations

from poisonq import Abandon, Broker, Lease
from poisonq.model import FailureRecord
from poisonq.spark.narrowing import (
    MAX_SUSPECTS,
    NARROWING,
    Chunks,
    after_replay,
    isolate_suspect,
    narrow,
)
from tests.helpers import assert_balanced, fill


def take(broker: Broker, queue: str, number: int, count: int) -> Lease:
    lease = broker.acquire_lease(queue, "stream", number, max_messages=count)
    assert lease is not None
    return lease


def replay(broker: Broker, lease: Lease) -> None:
    """What the source does when Spark plans the lease's batch once more after it failed."""
    assert broker.plan_lease(lease) > 1
    narrow(broker, lease, lease.entity)


def test_a_replayed_lease_keeps_its_first_eighth_and_gives_the_rest_back_uncounted(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, 20)
    lease = take(broker, queue, 1, 20)
    assert broker.plan_lease(lease) == 1  # the batch that failed
    replay(broker, lease)
    assert broker.lease_sequence_numbers(lease) == seqs[:3]  # ceil(20 / 8)
    back = broker.peek(queue, from_sequence=seqs[3], max_messages=20)
    assert [(m.state, m.delivery_count) for m in back] == [("active", 0)] * 17
    assert_balanced(broker)


def test_a_replayed_lease_of_one_message_abandons_it_counting_its_delivery(
    broker: Broker, queue: str
) -> None:
    [seq] = fill(broker, queue, 1)
    lease = take(broker, queue, 1, 1)
    broker.plan_lease(lease)
    replay(broker, lease)
    assert broker.lease_sequence_numbers(lease) == []
    [message] = broker.peek(queue)
    assert (message.sequence_number, message.state, message.delivery_count) == (seq, "active", 1)
    assert [f.error_type for f in message.failures] == ["QueryFailed"]
    assert_balanced(broker)


def test_the_leases_after_a_narrowed_replay_take_what_went_back_in_pieces_of_its_size(
    broker: Broker, queue: str
) -> None:
    fill(broker, queue, 100)
    lease = take(broker, queue, 1, 100)
    broker.plan_lease(lease)
    replay(broker, lease)
    assert after_replay(broker, lease) == Chunks(13, NARROWING - 1)  # 87 went back
    broker.complete_lease(lease)
    small = take(broker, queue, 2, 4)  # the same sizing for a small batch: 3 went back
    broker.plan_lease(small)
    replay(broker, small)
    assert after_replay(broker, small) == Chunks(1, 3)


def test_a_lease_planned_once_sizes_nothing(broker: Broker, queue: str) -> None:
    fill(broker, queue, 10)
    lease = take(broker, queue, 1, 10)
    broker.plan_lease(lease)
    assert after_replay(broker, lease) is None


def test_reading_a_lease_s_plan_count_counts_no_planning(broker: Broker, queue: str) -> None:
    fill(broker, queue, 3)
    lease = take(broker, queue, 1, 3)
    assert broker.lease_plans(lease) == 0
    broker.plan_lease(lease)
    assert broker.lease_plans(lease) == broker.lease_plans(lease) == 1
    broker.reset_lease_plans(lease)
    assert broker.lease_plans(lease) == 0


def test_the_piece_sizes_survive_in_spark_s_offsets() -> None:
    sizing = Chunks(13, 3)
    offset = {"lease": 4, **sizing.offset()}
    assert offset == {"lease": 4, "width": 13, "chunks": 3}
    assert Chunks.of(offset) == sizing
    assert Chunks.of({"lease": 4}) == Chunks()  # a checkpoint without sizing: full batches
    assert [Chunks(13, n).after_one() for n in (3, 2, 1)] == [
        Chunks(13, 2),
        Chunks(13, 1),
        Chunks(),
    ]
    assert Chunks().offset() == {}


def test_a_redelivered_message_first_in_its_lease_gets_a_batch_of_its_own(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, 6)
    first = take(broker, queue, 1, 1)
    broker.plan_lease(first)
    replay(broker, first)  # abandoned: delivered again next time
    lease = take(broker, queue, 2, 6)
    isolate_suspect(broker, lease)
    assert broker.lease_sequence_numbers(lease) == [seqs[0]]
    assert broker.counts(queue)["active"] == 5
    assert_balanced(broker)


def test_a_redelivered_message_after_fresh_ones_waits_for_the_next_batch(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, 6)
    first = take(broker, queue, 1, 4)
    broker.release_lease(first, hi=seqs[2])  # back uncounted: fresh again
    failure = FailureRecord(0.0, "QueryFailed", "failed alone")
    broker.settle_held(queue, [Abandon(seqs[3], first.lock_token, failure)])
    lease = take(broker, queue, 2, 6)
    isolate_suspect(broker, lease)
    assert broker.lease_sequence_numbers(lease) == seqs[:3]
    assert_balanced(broker)


def test_more_redelivered_messages_than_suspects_are_a_batch_delivered_again(
    broker: Broker, queue: str
) -> None:
    seqs = fill(broker, queue, MAX_SUSPECTS + 1)
    receiver = broker.receiver(queue)
    for message in receiver.receive(max_messages=MAX_SUSPECTS + 1):
        receiver.abandon(message)
    lease = take(broker, queue, 1, 10)
    isolate_suspect(broker, lease)
    assert broker.lease_sequence_numbers(lease) == seqs  # kept whole
