"""The ``poisonq`` Spark data source: batch reads (peek), streaming reads (leases) and writes.

Spark's Python workers are separate processes on the real clock, so these tests open their
own broker on the system clock (the ``live`` fixture) rather than the ``broker`` fixture.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql.functions import spark_partition_id

import poisonq
from poisonq import Broker, Message
from poisonq.failures import failure_from_exception
from poisonq.spark import source
from poisonq.spark.source import SourceOptions, StreamReader
from tests import helpers
from tests.helpers import (
    assert_balanced,
    fill_orders,
    on_both_stores,
    spark_store_url,
    start_stream,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.streaming import StreamingQuery


url = spark_store_url


@pytest.fixture
def live(url: str) -> Iterator[Broker]:
    """A broker on the real clock with a queue ``orders`` (5 deliveries, 30 s lock)."""
    with poisonq.connect(url) as opened:
        opened.create_queue("orders", max_delivery_count=5, lock_duration=30)
        yield opened


def read(spark: SparkSession, url: str, **options: str) -> DataFrame:
    reader = spark.read.format("poisonq").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def seqs_of(rows: list[Row]) -> list[int]:
    return sorted(row.sequence_number for row in rows)


# Batch read ---------------------------------------------------------------------------------


@on_both_stores
def test_a_batch_read_peeks_every_message_with_its_columns(
    spark: SparkSession, live: Broker, url: str
) -> None:
    seqs = fill_orders(live, 7)
    rows = sorted(read(spark, url, queue="orders").collect(), key=lambda r: r.sequence_number)
    assert [r.sequence_number for r in rows] == seqs
    assert [r.message_id for r in rows] == [f"m{n}" for n in range(7)]
    assert [bytes(r.body) for r in rows] == [f"b{n}".encode() for n in range(7)]
    first = rows[0]
    assert (first.subject, first.state, first.delivery_count) == ("order", "active", 0)
    assert first.properties == {"n": "0", "kind": "test"}  # values become text
    assert first.dead_letter_reason is None and first.failure_count == 0
    [peeked] = live.peek("orders", max_messages=1)
    assert abs(first.enqueued_time.timestamp() - peeked.enqueued_time.timestamp()) < 0.001
    counts = live.counts("orders")
    assert (counts["active"], counts["locked"], counts["completed"]) == (7, 0, 0)
    assert [m.delivery_count for m in live.peek("orders", max_messages=10)] == [0] * 7


def test_a_batch_read_splits_into_partitions_and_ranges(
    spark: SparkSession, live: Broker, url: str
) -> None:
    seqs = fill_orders(live, 7)
    df = read(spark, url, queue="orders", numPartitions="3")
    assert df.rdd.getNumPartitions() == 3
    placed = df.select("sequence_number", spark_partition_id().alias("part")).collect()
    assert sorted(r.sequence_number for r in placed) == seqs  # every message once
    assert {r.part for r in placed} == {0, 1, 2}  # every partition holds some
    ranged = read(spark, url, queue="orders", minSequence=str(seqs[2]), maxSequence=str(seqs[4]))
    assert seqs_of(ranged.collect()) == seqs[2:5]
    assert live.counts("orders")["active"] == 7  # a read never locks


@pytest.mark.parametrize("where", [{}, {"minSequence": "1000"}, {"lease": "1"}])
def test_a_batch_read_of_nothing_is_empty(
    spark: SparkSession, live: Broker, url: str, where: dict[str, str]
) -> None:
    if where:
        fill_orders(live, 3)
    assert read(spark, url, queue="orders", **where).count() == 0


def test_a_batch_read_with_the_lease_option_reads_what_the_lease_holds(
    spark: SparkSession, live: Broker, url: str
) -> None:
    seqs = fill_orders(live, 5)
    lease = live.acquire_lease("orders", "c1", 1, max_messages=3)
    assert lease is not None
    rows = read(spark, url, queue="orders", consumer="c1", lease="1").collect()
    assert seqs_of(rows) == seqs[:3]
    assert {(r.state, r.delivery_count, r.dead_letter_reason) for r in rows} == {
        ("locked", 1, None)
    }
    assert live.counts("orders")["locked"] == 3  # reading a lease neither settles nor renews
    assert live.lease_sequence_numbers(lease) == seqs[:3]


def dead_letter_some(broker: Broker) -> None:
    """m0, m1: InvalidCustomer with a ValueError; m2: Expired with no error; m3 poisoned by
    every delivery failing with a KeyError; m4 stays in the queue."""
    receiver = broker.receiver("orders")
    got = {m.message_id: m for m in receiver.receive(max_messages=3)}
    try:
        raise ValueError("no such customer")
    except ValueError as exc:
        bad_customer = exc
    receiver.dead_letter([got["m0"], got["m1"]], "InvalidCustomer", "customer 17", bad_customer)
    receiver.dead_letter(got["m2"], "Expired", "too late")
    for _ in range(5):
        [message] = receiver.receive()
        assert message.message_id == "m3"
        try:
            raise KeyError("warehouse")
        except KeyError as exc:
            receiver.abandon(message, exc)


def test_a_batch_read_of_the_dead_letter_queue_shows_why(
    spark: SparkSession, live: Broker, url: str
) -> None:
    fill_orders(live, 5)
    dead_letter_some(live)
    assert live.counts("orders")["dead_lettered"] == 4
    df = read(spark, url, queue="orders", subqueue="deadletter")
    rows = {r.message_id: r for r in df.collect()}
    assert sorted(rows) == ["m0", "m1", "m2", "m3"]
    expected_error = failure_from_exception(ValueError("x"), 0.0).error_type
    m0 = rows["m0"]
    assert (m0.state, m0.dead_letter_reason, m0.dead_letter_error_description) == (
        "dead_lettered",
        "InvalidCustomer",
        "customer 17",
    )
    assert (m0.last_error_type, m0.failure_count, bytes(m0.body)) == (expected_error, 1, b"b0")
    assert m0.last_fingerprint == rows["m1"].last_fingerprint  # raised at the same place
    m2 = rows["m2"]
    assert (m2.dead_letter_reason, m2.dead_letter_error_description) == ("Expired", "too late")
    assert (m2.last_error_type, m2.last_fingerprint, m2.failure_count) == (None, None, 0)
    m3 = rows["m3"]
    [peeked] = [m for m in live.peek("orders/$deadletterqueue") if m.message_id == "m3"]
    assert (m3.dead_letter_reason, m3.last_error_type, m3.failure_count) == (
        "MaxDeliveryCountExceeded",
        "KeyError",
        5,
    )
    assert m3.last_fingerprint == peeked.failures[-1].fingerprint != m0.last_fingerprint
    assert m3.dead_letter_error_description == peeked.dead_letter_error_description
    assert "warehouse" in (m3.dead_letter_error_description or "")

    by_address = read(spark, url, queue="orders/$deadletterqueue")
    assert sorted(r.message_id for r in by_address.collect()) == ["m0", "m1", "m2", "m3"]

    df.createOrReplaceTempView("orders_dlq")
    grouped = spark.sql(
        "SELECT dead_letter_reason AS reason, count(*) AS n FROM orders_dlq"
        " GROUP BY dead_letter_reason ORDER BY reason"
    ).collect()
    assert [(r.reason, r.n) for r in grouped] == [
        ("Expired", 1),
        ("InvalidCustomer", 2),
        ("MaxDeliveryCountExceeded", 1),
    ]
    assert live.counts("orders")["active"] == 1  # m4 untouched


# Options ------------------------------------------------------------------------------------


def test_a_read_without_a_queue_option_says_so(spark: SparkSession, live: Broker, url: str) -> None:
    with pytest.raises(Exception, match=r'option\("queue"'):
        read(spark, url).collect()


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("maxMessagesPerBatch", "abc", r"option maxMessagesPerBatch must be an integer, not 'abc'"),
        ("maxMessagesPerBatch", "0", r"option maxMessagesPerBatch must be at least 1, not 0"),
        ("numPartitions", "-2", r"option numPartitions must be at least 1, not -2"),
    ],
)
def test_bad_integer_options_name_the_option(
    spark: SparkSession, live: Broker, url: str, option: str, value: str, match: str
) -> None:
    fill_orders(live, 1)
    with pytest.raises(Exception, match=match):
        read(spark, url, queue="orders", **{option: value}).collect()


def test_a_bad_lock_duration_names_the_option(spark: SparkSession, live: Broker, url: str) -> None:
    fill_orders(live, 1)
    with pytest.raises(Exception, match="lockDuration"):
        read(spark, url, queue="orders", lockDuration="abc").collect()


# Streaming read -----------------------------------------------------------------------------


@dataclass
class Batch:
    """What a foreachBatch call saw: its rows, and the queue's completions at that moment."""

    id: int
    seqs: list[int]
    deliveries: list[int]
    states: set[str]
    completed_before: int


def recorder(
    url: str, batches: list[Batch], fail_on: int | None = None
) -> Callable[[Any, int], None]:
    """A foreachBatch function recording each batch; on call ``fail_on`` (0-based) it records
    the batch and then raises."""
    calls = [0]

    def handle(df: DataFrame, batch_id: int) -> None:
        rows = sorted(df.collect(), key=lambda r: r.sequence_number)
        with poisonq.connect(url) as broker:
            completed = broker.counts("orders")["completed"]
        batches.append(
            Batch(
                batch_id,
                [r.sequence_number for r in rows],
                [r.delivery_count for r in rows],
                {r.state for r in rows},
                completed,
            )
        )
        call, calls[0] = calls[0], calls[0] + 1
        if call == fail_on:
            raise RuntimeError(f"sink down in batch {batch_id}")

    return handle


def run_to_failure(query: StreamingQuery) -> None:
    try:
        with pytest.raises(Exception, match="sink down"):
            query.processAllAvailable()
    finally:
        query.stop()


@on_both_stores
def test_a_stream_reads_leases_of_at_most_max_messages_and_completes_them(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    seqs = fill_orders(live, 25)
    batches: list[Batch] = []
    query = start_stream(
        spark, url, tmp_path / "ck", recorder(url, batches), "t1", maxMessagesPerBatch="10"
    )
    try:
        query.processAllAvailable()
        # processAllAvailable returns once a trigger found no new data, i.e. after a
        # latestOffset call whose start was the last lease: that call completed it.
        after_processing = live.counts("orders")
    finally:
        query.stop()
    data = [b for b in batches if b.seqs]
    assert [(b.id, len(b.seqs)) for b in data] == [(0, 10), (1, 10), (2, 5)]
    assert sorted(s for b in data for s in b.seqs) == seqs  # each message exactly once
    assert all(b.deliveries == [1] * len(b.seqs) for b in data)  # one delivery each
    assert all(b.states == {"locked"} for b in data)
    # The latestOffset call that planned batch k completed lease k (batch k - 1): while a
    # batch runs, every earlier lease is completed and its own is not.
    assert [b.completed_before for b in data] == [0, 10, 20]
    assert (after_processing["completed"], after_processing["locked"]) == (25, 0)
    assert live.lease("orders", "t1") is not None and live.lease("orders", "t1", 3) is not None
    assert live.lease("orders", "t1", 4) is None  # nothing left to lease
    assert_balanced(live)


def test_an_idle_stream_looks_again_only_when_the_store_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source, "IDLE_RECHECK", 3600.0)  # only a change may end the idling
    path = tmp_path / "idle.db"
    url = f"sqlite:///{path}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        reader = StreamReader(SourceOptions.parse({"url": url, "queue": "orders"}))
        limit = reader.getDefaultReadLimit()
        try:
            assert reader.latestOffset({"lease": 0}, limit) == {"lease": 0}  # empty
            # Another connection holds the write lock: an idle look must not need it (a
            # write transaction would wait for it for the store's 30 s busy timeout).
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            looks: list[dict[str, int]] = []
            look = threading.Thread(
                target=lambda: looks.append(reader.latestOffset({"lease": 0}, limit))
            )
            look.start()
            look.join(timeout=10)
            answered_while_locked = not look.is_alive()
            blocker.execute("ROLLBACK")
            blocker.close()
            look.join()
            assert answered_while_locked and looks == [{"lease": 0}]
            broker.sender("orders").send(Message(body=b"new"))
            assert reader.latestOffset({"lease": 0}, limit) == {"lease": 1}
        finally:
            reader.stop()
        assert broker.counts("orders")["locked"] == 1


@on_both_stores
def test_a_batch_the_sink_had_written_is_completed_though_its_lock_ran_out(url: str) -> None:
    """Spark's file sink skips a replayed batch it had committed before the kill, so nothing
    reads (and renews) that batch's lease; the query may stay down past its lock. The next
    planning completes the lease anyway, and the next lease does not take its messages again
    (found by the chaos suite: a batch written twice)."""
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", lock_duration=30)
        seqs = fill_orders(broker, 6)
        options = SourceOptions.parse({"url": url, "queue": "orders", "maxMessagesPerBatch": "3"})
        killed = StreamReader(options)
        limit = killed.getDefaultReadLimit()
        assert killed.latestOffset({"lease": 0}, limit) == {"lease": 1}
        killed.stop()  # killed after the sink committed batch 0, down past the lease's lock
        ran_out = "UPDATE {} SET locked_until = 1 WHERE locked_until IS NOT NULL"
        for table in ["messages", "leases"] if url.startswith("sqlite") else ["messages"]:
            helpers.execute_behind_the_back(url, ran_out.format(table))
        restarted = StreamReader(options)
        try:
            assert restarted.latestOffset({"lease": 1}, limit) == {"lease": 2}
        finally:
            restarted.stop()
        lease = broker.lease("orders", options.consumer, 2)
        assert lease is not None and broker.lease_sequence_numbers(lease) == seqs[3:]
        counts = broker.counts("orders")
        assert (counts["completed"], counts["locked"], counts["active"]) == (3, 3, 0)
        assert_balanced(broker)


@on_both_stores
def test_a_restart_from_the_checkpoint_replays_the_failed_lease(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    seqs = fill_orders(live, 25)
    checkpoint = tmp_path / "ck"
    first: list[Batch] = []
    run_to_failure(
        start_stream(
            spark, url, checkpoint, recorder(url, first, fail_on=1), "t2", maxMessagesPerBatch="10"
        )
    )
    assert [(b.id, len(b.seqs)) for b in first] == [(0, 10), (1, 10)]
    failed = first[1].seqs
    counts = live.counts("orders")
    assert (counts["completed"], counts["locked"], counts["active"]) == (10, 10, 5)
    lease = live.lease("orders", "t2", 2)
    assert lease is not None and live.lease_sequence_numbers(lease) == failed

    second: list[Batch] = []
    query = start_stream(
        spark, url, checkpoint, recorder(url, second), "t2", maxMessagesPerBatch="10"
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    data = [b for b in second if b.seqs]
    # The same batch id first, narrowed to its first eighth (2 of 10): the rest went back to
    # the queue, and the next leases take it in parts of that size, then full batches.
    assert (data[0].id, data[0].seqs) == (1, failed[:2])
    assert data[0].deliveries == [1] * 2  # replaying a lease counts no new delivery
    assert [len(b.seqs) for b in data[1:]] == [2, 2, 2, 2, 5]
    assert [b.id for b in data] == list(range(1, 7))
    assert all(b.deliveries == [1] * len(b.seqs) for b in data[1:])  # given back uncounted
    assert sorted(first[0].seqs + [s for b in data for s in b.seqs]) == seqs
    counts = live.counts("orders")
    assert (counts["completed"], counts["locked"], counts["active"]) == (25, 0, 0)
    assert_balanced(live)


def test_a_dead_query_leaves_its_lease_to_expire_and_be_delivered_again(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    seqs = fill_orders(live, 4)
    batches: list[Batch] = []
    query = start_stream(
        spark, url, tmp_path / "ck", recorder(url, batches, fail_on=0), "t3", lockDuration="3"
    )
    run_to_failure(query)
    assert batches == [Batch(0, seqs, [1] * 4, {"locked"}, 0)]
    # The batch's read renewed the locks for 3 s a moment ago; the failure settled nothing.
    counts = live.counts("orders")
    assert (counts["locked"], counts["completed"], counts["active"]) == (4, 0, 0)
    receiver = live.receiver("orders")
    redelivered: list[poisonq.ReceivedMessage] = []
    deadline = time.monotonic() + 15
    while len(redelivered) < 4 and time.monotonic() < deadline:
        redelivered += receiver.receive(max_messages=4, max_wait=5)
    assert sorted(m.sequence_number for m in redelivered) == seqs  # none lost
    assert [m.delivery_count for m in redelivered] == [2] * 4
    receiver.complete(redelivered)
    assert live.counts("orders")["completed"] == 4
    assert_balanced(live)


# Write --------------------------------------------------------------------------------------


def write(df: DataFrame, url: str, queue: str = "orders") -> None:
    df.write.format("poisonq").option("url", url).option("queue", queue).mode("append").save()


@on_both_stores
def test_a_write_sends_each_row_with_its_columns(
    spark: SparkSession, live: Broker, url: str
) -> None:
    df = spark.createDataFrame(
        [(b"x", "id-1", "s", {"k": "v"}), (b"yy", "id-2", None, None)],
        "body binary, message_id string, subject string, properties map<string,string>",
    )
    write(df, url)
    got = {m.message_id: m for m in live.peek("orders")}
    assert sorted(got) == ["id-1", "id-2"]
    assert (got["id-1"].body, got["id-1"].subject, got["id-1"].properties) == (
        b"x",
        "s",
        {"k": "v"},
    )
    assert (got["id-2"].body, got["id-2"].subject, got["id-2"].properties) == (b"yy", None, {})
    write(spark.createDataFrame([("hello",)], "body string"), url)
    assert [m.body for m in live.peek("orders", max_messages=10)][-1] == b"hello"
    assert live.counts("orders")["active"] == 3


def test_writing_twice_with_duplicate_detection_enqueues_each_id_once(
    spark: SparkSession, live: Broker, url: str
) -> None:
    live.create_queue("dedup", requires_duplicate_detection=True)
    df = spark.createDataFrame(
        [(f"b{n}", f"id-{n}") for n in range(4)], "body string, message_id string"
    ).repartition(2)
    write(df, url, "dedup")
    write(df, url, "dedup")
    assert sorted(m.message_id for m in live.peek("dedup")) == [f"id-{n}" for n in range(4)]
    assert live.counts("dedup")["active"] == 4


@pytest.mark.parametrize(
    ("ddl", "match"),
    [
        ("message_id string", r"body column"),
        ("body string, colour string", r"unknown columns \['colour'\]"),
    ],
)
def test_a_write_of_the_wrong_columns_fails_naming_them(
    spark: SparkSession, live: Broker, url: str, ddl: str, match: str
) -> None:
    values = tuple("x" for _ in ddl.split(","))
    with pytest.raises(Exception, match=match):
        write(spark.createDataFrame([values], ddl), url)
    assert live.counts("orders")["active"] == 0


def test_a_write_in_overwrite_mode_is_refused(spark: SparkSession, live: Broker, url: str) -> None:
    live.sender("orders").send(Message(body=b"kept"))
    df = spark.createDataFrame([(b"x",)], "body binary")
    writer = df.write.format("poisonq").option("url", url).option("queue", "orders")
    with pytest.raises(Exception, match="never replaces what the queue holds"):
        writer.mode("overwrite").save()
    assert live.counts("orders")["active"] == 1


def test_a_write_with_a_time_to_live_column_sets_the_expiry(
    spark: SparkSession, live: Broker, url: str
) -> None:
    before = datetime.now(UTC)
    write(spark.createDataFrame([("x", 60.0)], "body string, time_to_live double"), url)
    [message] = live.peek("orders")
    assert message.expires_at is not None
    assert (
        before + timedelta(seconds=59)
        < message.expires_at
        < datetime.now(UTC) + timedelta(seconds=61)
    )


def test_a_write_with_a_scheduled_enqueue_time_column_schedules(
    spark: SparkSession, live: Broker, url: str
) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    df = spark.createDataFrame([("x", at)], "body string, scheduled_enqueue_time timestamp")
    write(df, url)
    [message] = live.peek("orders")
    assert (message.state, message.scheduled_enqueue_time) == ("scheduled", at)


@on_both_stores
def test_a_plain_query_restarted_after_each_failure_dead_letters_only_the_poison(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A foreachBatch that raises on one poison row, restarted from its checkpoint after each
    failure as a scheduler does, dead-letters only the poison: a replayed lease is narrowed,
    so the good messages of its batch never spend their deliveries on it."""
    live.update_queue("orders", max_delivery_count=2)
    seqs = fill_orders(live, 12)
    poison = seqs[4]
    written: dict[int, list[int]] = {}  # batch id -> sequence numbers: idempotent per batch

    def handle(df: DataFrame, batch_id: int) -> None:
        got = sorted(r.sequence_number for r in df.select("sequence_number").collect())
        if poison in got:
            raise RuntimeError(f"sink down: cannot write message {poison}")
        written[batch_id] = got

    restarts = 0
    while True:
        query = start_stream(spark, url, tmp_path / "ck", handle, "plain", maxMessagesPerBatch="12")
        try:
            query.processAllAvailable()
            break
        except Exception as exc:  # the query died on the poison row: restart it
            assert "sink down" in str(exc)
            restarts += 1
            assert restarts <= 2 * 4 + 2 * 2, "halving 12 messages, then 2 deliveries"
        finally:
            query.stop()
    everything = [seq for batch in written.values() for seq in batch]
    assert sorted(everything) == [s for s in seqs if s != poison]  # each exactly once
    dead = live.peek("orders/$deadletterqueue")
    assert [m.sequence_number for m in dead] == [poison]
    assert dead[0].dead_letter_reason == "MaxDeliveryCountExceeded"
    assert live.counts("orders")["completed"] == 11
    assert_balanced(live)
