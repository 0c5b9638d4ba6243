"""The history the store keeps for the charts, on both stores: dead-letterings by reason,
subject and fingerprint, depths read back from the ledger, buckets pruned by age, and
concurrent writers that lose no count."""

from __future__ import annotations

import threading

import pytest

import poisonq
from poisonq import Broker, ManualClock, Message
from poisonq.history import TREND, WINDOWS, Window, depths, peaks, timeline
from poisonq.store.base import DeadLetterCount, DepthChange
from poisonq.store.history import HOUR, KEEP, MINUTE, PRUNE_EVERY
from tests.helpers import execute_behind_the_back


def _fail(customer: str) -> None:
    raise KeyError(customer)


def _dead_letter(broker: Broker, queue: str, count: int, reason: str, subject: str) -> None:
    """Send ``count`` messages with ``subject`` and dead-letter them as ``reason``, one batch,
    each with a KeyError raised at one place (one fingerprint)."""
    broker.sender(queue).send([Message(body=str(n), subject=subject) for n in range(count)])
    receiver = broker.receiver(queue)
    try:
        _fail("c-1")
    except KeyError as exc:
        receiver.dead_letter(receiver.receive(max_messages=count), reason, error=exc)


def _rows(url: str, table: str) -> int:
    return int(execute_behind_the_back(url, f"SELECT count(*) FROM {table}")[0][0])  # type: ignore[call-overload]


def test_dead_letterings_are_counted_by_reason_subject_and_fingerprint(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    _dead_letter(broker, queue, 3, "InvalidOrder", "order")
    clock.advance(5 * MINUTE)
    _dead_letter(broker, queue, 2, "Timeout", "refund")
    by_reason = broker.dead_letter_timeline(queue, "reason", "hour")
    assert by_reason.step == MINUTE and len(by_reason.series["InvalidOrder"]) == 60
    assert by_reason.series["InvalidOrder"][-6] == 3 and sum(by_reason.series["InvalidOrder"]) == 3
    assert by_reason.series["Timeout"][-1] == 2
    assert list(by_reason.series) == ["InvalidOrder", "Timeout"]  # the largest first
    assert by_reason.totals[-6:] == [3, 0, 0, 0, 0, 2]
    by_subject = broker.dead_letter_timeline(queue, "subject", "week")
    assert {k: sum(v) for k, v in by_subject.series.items()} == {"order": 3, "refund": 2}
    [fingerprint] = broker.dead_letter_timeline(queue, "fingerprint", "day").series
    assert fingerprint == broker.dead_letter_groups(queue, "fingerprint")[0].key


def test_a_purge_leaves_the_history_of_what_was_dead_lettered(broker: Broker, queue: str) -> None:
    _dead_letter(broker, queue, 4, "InvalidOrder", "order")
    broker.purge(queue)
    assert broker.dead_letter_timeline(queue, "reason", "hour").totals[-1] == 4


def test_poison_and_expiry_are_counted_under_their_reasons(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    broker.sender(queue).send([Message(body=b"a"), Message(body=b"b", time_to_live=1)])
    receiver = broker.receiver(queue)
    clock.advance(2)
    for _ in range(3):
        [message] = receiver.receive(max_messages=5)
        receiver.abandon(message, error=RuntimeError("boom"))
    receiver.receive(max_messages=5)
    series = broker.dead_letter_timeline(queue, "reason", "hour").series
    assert {k: sum(v) for k, v in series.items()} == {
        "MaxDeliveryCountExceeded": 1,
        "TTLExpiredException": 1,
    }


def test_depth_is_read_back_from_the_ledger(broker: Broker, queue: str, clock: ManualClock) -> None:
    start = clock.now()
    broker.sender(queue).send([Message(body=str(n)) for n in range(10)])
    clock.advance(HOUR)
    receiver = broker.receiver(queue)
    receiver.complete(receiver.receive(max_messages=4))
    clock.advance(2 * HOUR)
    broker.sender(queue).send([Message(body=b"x")])
    trend = broker.queue_trends()["orders"]
    assert trend.step == HOUR and len(trend.depth) == 24
    bar = (int(start) - trend.start) // HOUR
    assert trend.depth[: bar - 1] == [0] * (bar - 1)
    # The highest depth of each hour: the second opened with 10, the last reached 7.
    assert trend.depth[bar:] == [10, 10, 6, 7]
    assert trend.dead_lettered == [0] * 24


def test_a_backlog_that_came_and_went_within_the_hour_shows(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """The hour's bar is the highest depth in the hour, not the depth at its end: 500 sent
    and drained in one hour (in commits of 100) is a bar of 500, though the hour ends
    empty."""
    clock.advance(HOUR - clock.now() % HOUR + 60)  # a minute into an hour
    receiver = broker.receiver(queue)
    for _ in range(5):
        broker.sender(queue).send([Message(body=str(n)) for n in range(100)])
        clock.advance(60)
    for _ in range(5):
        receiver.complete(receiver.receive(max_messages=100))
        clock.advance(60)
    broker.sender(queue).send([Message(body=b"x")] * 3)  # the hour ends with 3
    clock.advance(HOUR)
    depth = broker.queue_trends()["orders"].depth
    assert depth[-3:] == [0, 500, 3]
    assert broker.counts(queue)["active"] == 3


def test_a_bucket_from_before_schema_10_has_no_peak() -> None:
    """Rows written before the peak was kept: the bar falls back to the depths read back."""
    frame = Window(4 * MINUTE, MINUTE, MINUTE)
    now = 10 * MINUTE + 5
    changes = [DepthChange(1, 8 * MINUTE, 5, None), DepthChange(1, 9 * MINUTE, 7, 40)]
    assert depths(changes, 9, frame, now) == [5, 7, 9, 9]
    assert peaks(changes, 9, frame, now) == [5, 7, 40, 9]


def test_the_overview_counts_each_queues_dead_letterings(broker: Broker, queue: str) -> None:
    broker.create_queue("payments")
    _dead_letter(broker, queue, 3, "InvalidOrder", "order")
    _dead_letter(broker, "payments", 1, "Declined", "payment")
    trends = broker.queue_trends()
    assert trends["orders"].dead_lettered[-1] == 3
    assert trends["payments"].dead_lettered[-1] == 1
    assert trends["orders"].depth[-1] == 3  # the hour's highest: 3 sent, then dead-lettered


def test_buckets_are_pruned_by_age(
    broker: Broker, queue: str, clock: ManualClock, url: str
) -> None:
    for _ in range(3):
        _dead_letter(broker, queue, 1, "InvalidOrder", "order")
        clock.advance(HOUR)
    minutes, hours = _rows(url, "depth_history"), _rows(url, "dead_letter_history")
    assert minutes > 0 and hours > 0
    clock.advance(KEEP[MINUTE])
    _dead_letter(broker, queue, 1, "InvalidOrder", "order")  # prunes the minutes
    kept = execute_behind_the_back(url, "SELECT DISTINCT span FROM dead_letter_history")
    assert {row[0] for row in kept} == {MINUTE, HOUR}
    old = execute_behind_the_back(
        url, f"SELECT count(*) FROM dead_letter_history WHERE span = {MINUTE}"
    )
    assert old[0][0] == 1  # only the new minute is left
    assert sum(broker.dead_letter_timeline(queue, "reason", "week").totals) == 4
    clock.advance(KEEP[HOUR] + PRUNE_EVERY)
    _dead_letter(broker, queue, 1, "InvalidOrder", "order")
    assert sum(broker.dead_letter_timeline(queue, "reason", "week").totals) == 1
    assert _rows(url, "dead_letter_history") == 2  # this minute and this hour


def test_the_history_goes_with_its_queue(broker: Broker, queue: str, url: str) -> None:
    _dead_letter(broker, queue, 2, "InvalidOrder", "order")
    broker.delete_queue(queue)
    assert _rows(url, "dead_letter_history") == 0
    assert _rows(url, "depth_history") == 0


def test_concurrent_writers_lose_no_count(url: str, clock: ManualClock) -> None:
    """Four brokers (four connections, as four processes would have) dead-letter into one
    queue at once, in the same buckets; every message is counted once."""
    with poisonq.connect(url, clock=clock) as admin:
        admin.create_queue("orders")
    workers, batches, size = 4, 10, 5

    def work(subject: str) -> None:
        with poisonq.connect(url, clock=clock) as broker:
            sender, receiver = broker.sender("orders"), broker.receiver("orders")
            for _ in range(batches):
                sender.send([Message(body=b"x", subject=subject) for _ in range(size)])
                taken = 0
                for _ in range(100):  # (on PostgreSQL a receive beside another may come short)
                    received = receiver.receive(max_messages=size - taken)
                    receiver.dead_letter(received, "Broken")
                    taken += len(received)
                    if taken == size:
                        break

    threads = [threading.Thread(target=work, args=(f"s{n % 2}",)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with poisonq.connect(url, clock=clock) as broker:
        total = workers * batches * size
        assert broker.count_dead_letters("orders") == total
        for window in WINDOWS:
            assert sum(broker.dead_letter_timeline("orders", "reason", window).totals) == total
        by_subject = broker.dead_letter_timeline("orders", "subject", "hour").series
        assert {k: sum(v) for k, v in by_subject.items()} == {"s0": total / 2, "s1": total / 2}
        # The hour's highest depth: one batch at least, never more than every worker's at
        # once (each sends its batch and dead-letters it before the next).
        assert size <= broker.queue_trends()["orders"].depth[-1] <= workers * size
        assert broker.counts("orders")["active"] == 0


@pytest.mark.parametrize("name", ["hour", "day", "week"])
def test_windows_end_with_the_bar_that_holds_now(name: str) -> None:
    frame = WINDOWS[name]
    now = 1_700_000_123.0
    start = frame.start(now)
    assert start <= now - frame.length + frame.step
    assert start + frame.bars * frame.step > now >= start + (frame.bars - 1) * frame.step
    assert frame.step % frame.span == 0 and frame.length <= KEEP[frame.span]


def test_binning_drops_what_falls_outside_the_window() -> None:
    frame = Window(4 * MINUTE, MINUTE, MINUTE)
    now = 10 * MINUTE + 5
    counts = [DeadLetterCount(1, b * MINUTE, "k", 1) for b in range(4, 12)]
    assert timeline(counts, frame, now).series == {"k": [1, 1, 1, 1]}
    changes = [DepthChange(1, 8 * MINUTE, 5), DepthChange(1, 9 * MINUTE, 7)]
    assert depths(changes, 9, frame, now) == [5, 7, 9, 9]
    assert depths([], 3, TREND, now) == [3] * 24


def test_a_bucket_written_before_schema_10_reads_back_and_takes_a_peak(
    broker: Broker, queue: str, clock: ManualClock, url: str
) -> None:
    """A store upgraded to schema 10 has buckets without a peak (NULL): the chart reads
    their depths back as before, and the bucket's next change records the peak."""
    clock.advance(HOUR - clock.now() % HOUR + 60)
    broker.sender(queue).send([Message(body=str(n)) for n in range(4)])
    receiver = broker.receiver(queue)
    receiver.complete(receiver.receive(max_messages=4))
    execute_behind_the_back(url, "UPDATE depth_history SET peak = NULL")
    assert broker.queue_trends()["orders"].depth[-1] == 0  # opened 0, ends 0: no peak kept
    broker.sender(queue).send([Message(body=b"x")] * 2)
    receiver.complete(receiver.receive(max_messages=2))
    assert broker.queue_trends()["orders"].depth[-1] == 2  # the peak from here on
