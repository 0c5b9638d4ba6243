"""``poisonq.spark.foreach_batch`` and ``poisonq.spark.dead_letter`` on a real stream.

Each test runs a streaming query of the ``poisonq`` source on SQLite until it has nothing
left (``processAllAvailable``), with a handler that records what each successful call saw:
every message must be written exactly once or dead-lettered, and the ledger must balance.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import pytest
from pyspark.sql import functions as F

import poisonq
from poisonq import Broker
from poisonq.errors import InvalidOptionError
from poisonq.model import Abandon
from poisonq.spark import dead_letter, foreach_batch
from tests.helpers import (
    assert_balanced,
    fill_orders,
    on_both_stores,
    spark_store_url,
    start_stream,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

cloudpickle.register_pickle_by_value(sys.modules[__name__])


url = spark_store_url


@pytest.fixture
def live(url: str) -> Iterator[Broker]:
    """A broker on the real clock with a queue ``orders`` (2 deliveries, 30 s lock)."""
    with poisonq.connect(url) as opened:
        opened.create_queue("orders", max_delivery_count=2, lock_duration=30)
        yield opened


def seqs(df: DataFrame) -> list[int]:
    return sorted(r.sequence_number for r in df.select("sequence_number").collect())


def writing(written: list[int], bad: int, error: BaseException) -> Callable[[DataFrame, int], None]:
    """A handler that "writes" a batch (records its sequence numbers) unless it holds
    ``bad``, for which it raises ``error``."""

    def handle(df: DataFrame, batch_id: int) -> None:
        got = seqs(df)
        if bad in got:
            raise copy.copy(error)  # a fresh one each time, its traceback its own
        written.extend(got)

    return handle


def run(
    spark: SparkSession, url: str, checkpoint: Path, handle: Callable[[Any, int], None]
) -> None:
    query = start_stream(spark, url, checkpoint, handle, "fb")
    try:
        query.processAllAvailable()
    finally:
        query.stop()


@on_both_stores
def test_a_raising_row_is_isolated_within_its_batch_and_the_query_goes_on(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    sent = fill_orders(live, 8)
    poison = sent[3]
    written: list[int] = []

    def handle(df: DataFrame, batch_id: int) -> None:
        got = seqs(df)
        if poison in got:
            raise RuntimeError(f"cannot write message {poison}")  # the traceback shows it
        written.extend(got)

    run(spark, url, tmp_path / "ck", foreach_batch(handle))
    assert sorted(written) == [s for s in sent if s != poison]  # each exactly once
    [dead] = live.peek("orders/$deadletterqueue")
    assert (dead.sequence_number, dead.dead_letter_reason) == (poison, "MaxDeliveryCountExceeded")
    assert [f.error_type for f in dead.failures] == ["RuntimeError"] * 2
    assert "cannot write message" in dead.failures[0].message
    assert "raise RuntimeError" in dead.failures[0].traceback
    assert live.counts("orders")["completed"] == 7
    assert_balanced(live)


def test_a_permanent_error_dead_letters_its_message_at_once(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    sent = fill_orders(live, 4)
    bad = sent[1]
    written: list[int] = []
    handle = writing(written, bad, poisonq.PermanentError(f"order {bad} can never be written"))

    run(spark, url, tmp_path / "ck", foreach_batch(handle))
    assert sorted(written) == [s for s in sent if s != bad]
    [dead] = live.peek("orders/$deadletterqueue")
    assert (dead.sequence_number, dead.dead_letter_reason, dead.delivery_count) == (
        bad,
        "PermanentError",
        1,
    )
    assert_balanced(live)


class NoSuchCustomer(poisonq.PermanentError):
    """A permanent error of the job's own."""


def raising_in_the_worker(bad: dict[int, type[Exception]]) -> Callable[[Any], Any]:
    """A ``mapInArrow`` function that raises ``bad[seq]`` on the row of message ``seq``."""

    def each(batches: Any) -> Any:
        for batch in batches:
            for seq in batch.column("sequence_number").to_pylist():
                if seq in bad:
                    raise bad[seq](f"message {seq} cannot be written")
            yield batch.select(["sequence_number"])

    return each


def test_a_permanent_error_raised_in_a_python_worker_dead_letters_its_message_at_once(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A PermanentError (a subclass of it here) or a ``permanent=`` type raised in the job's
    Python workers, not on the driver, is told by its class as on the driver: its message is
    dead-lettered at its first delivery with the class as its reason, not retried."""
    sent = fill_orders(live, 6)
    bad = {sent[1]: NoSuchCustomer, sent[4]: ValueError}
    written: list[int] = []

    def handle(df: DataFrame, batch_id: int) -> None:
        rows = df.mapInArrow(raising_in_the_worker(bad), "sequence_number long").collect()
        written.extend(row.sequence_number for row in rows)

    run(spark, url, tmp_path / "ck", foreach_batch(handle, permanent=(ValueError,)))
    assert sorted(written) == [s for s in sent if s not in bad]
    dead = {m.sequence_number: m for m in live.peek("orders/$deadletterqueue")}
    assert {seq: (m.dead_letter_reason, m.delivery_count) for seq, m in dead.items()} == {
        sent[1]: ("NoSuchCustomer", 1),
        sent[4]: ("ValueError", 1),
    }
    assert "cannot be written" in dead[sent[4]].dead_letter_error_description
    assert_balanced(live)


def test_rows_failing_an_expectation_are_dead_lettered_and_kept_from_the_handler(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    sent = fill_orders(live, 4)
    [long] = live.sender("orders").send(poisonq.Message(body=b"far too long"))
    written: list[int] = []

    def handle(df: DataFrame, batch_id: int) -> None:
        written.extend(seqs(df))

    run(spark, url, tmp_path / "ck", foreach_batch(handle, {"short": "length(body) <= 2"}))
    assert sorted(written) == sent
    [dead] = live.peek("orders/$deadletterqueue")
    assert (dead.sequence_number, dead.dead_letter_reason) == (long, "ExpectationFailed")
    assert "short" in (dead.dead_letter_error_description or "")
    assert live.counts("orders")["completed"] == 4
    assert_balanced(live)


def test_the_handler_dead_letters_the_rows_it_rejects(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    sent = fill_orders(live, 6)
    written: list[int] = []
    rejected: list[int] = []

    def handle(df: DataFrame, batch_id: int) -> None:
        late = F.col("properties")["n"].cast("int") >= 4
        rejected.append(dead_letter(df.filter(late), "TooLate", "message_id"))
        written.extend(seqs(df.filter(~late)))

    run(spark, url, tmp_path / "ck", foreach_batch(handle))
    assert sorted(written) == sent[:4] and sum(rejected) == 2
    dead = sorted(live.peek("orders/$deadletterqueue"), key=lambda m: m.sequence_number)
    assert [(m.dead_letter_reason, m.dead_letter_error_description) for m in dead] == [
        ("TooLate", "m4"),
        ("TooLate", "m5"),
    ]
    assert live.counts("orders")["completed"] == 4
    assert_balanced(live)


def test_a_dataframe_not_from_the_source_is_refused(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1,)], "sequence_number long")
    with pytest.raises(InvalidOptionError, match="not a read of the poisonq source"):
        foreach_batch(lambda df, batch_id: None)(frame, 0)
    with pytest.raises(InvalidOptionError, match="not a read of the poisonq source"):
        dead_letter(frame, "Rejected")


def test_a_defect_stops_the_query_with_the_lease_released_and_a_restart_writes_once(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    sent = fill_orders(live, 6)
    checkpoint = tmp_path / "ck"

    def broken(df: DataFrame, batch_id: int) -> None:
        raise ValueError("the sink is misconfigured")

    with pytest.raises(Exception, match="a defect, not poison"):
        run(spark, url, checkpoint, foreach_batch(broken))
    counts = live.counts("orders")
    assert (counts["active"], counts["locked"], counts["dead_lettered"]) == (6, 0, 0)
    assert [m.delivery_count for m in live.peek("orders")] == [0] * 6  # none counted

    written: list[int] = []

    def fixed(df: DataFrame, batch_id: int) -> None:
        written.extend(seqs(df))

    run(spark, url, checkpoint, foreach_batch(fixed))  # replays the released lease first
    assert sorted(written) == sent
    assert live.counts("orders")["completed"] == 6
    assert_balanced(live)


def test_trigger_available_now_reads_everything_once_and_completes_every_batch(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """availableNow runs batches until what the queue held at the start is read (messages
    given back to retry included), and each batch is completed when its handler is done:
    Spark never plans a batch after the last one, which would complete it."""
    sent = fill_orders(live, 25)
    poison = sent[12]
    written: list[int] = []
    handle = writing(written, poison, RuntimeError(f"cannot write message {poison}"))

    query = (
        spark.readStream.format("poisonq")
        .option("url", url)
        .option("queue", "orders")
        .option("consumer", "now")
        .option("maxMessagesPerBatch", 10)
        .load()
        .writeStream.foreachBatch(foreach_batch(handle))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    assert sorted(written) == [s for s in sent if s != poison]
    assert live.counts("orders")["completed"] == 24
    assert live.counts("orders")["locked"] == 0
    assert [m.sequence_number for m in live.peek("orders/$deadletterqueue")] == [poison]
    assert_balanced(live)


class Killed(Exception):
    """Stands for a kill of the driver between a batch's write and its completion: the
    query dies there, Spark's commit log never records the batch, and nothing completes
    its lease."""


def partition_writer(out: Path) -> Callable[[DataFrame, int], None]:
    """The handler docs/spark.md advises: one write per call, overwriting a directory named
    by the batch id and the call's first sequence number."""

    def write(df: DataFrame, batch_id: int) -> None:
        first = df.agg(F.min("sequence_number")).first()
        if first is None or first[0] is None:
            return
        df.select("message_id").write.mode("overwrite").parquet(
            f"{out}/batch={batch_id}/first={first[0]}"
        )

    return write


@on_both_stores
@pytest.mark.parametrize(
    ("redelivered", "lock_runs_out"),
    [(None, True), (2, False), (2, True)],
    ids=["lock-ran-out", "redelivered-within-lock", "redelivered-lock-ran-out"],
)
def test_a_batch_replayed_after_a_kill_between_its_write_and_its_completion_overwrites_it(
    spark: SparkSession,
    live: Broker,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redelivered: int | None,
    lock_runs_out: bool,
) -> None:
    """The kill point of the chaos suite's finding: the handler wrote batch 0, then the
    query died before the lease was completed and before Spark's commit log took the batch.
    Restarted, Spark replays batch 0 with the same offsets (the same lease): it must bring
    the same messages, so that the write of the replay overwrites the killed one's. Before,
    a lease whose lock ran out while the query was down came back empty and its messages
    in a later batch (another directory: written twice), and a lease holding a message
    delivered before was narrowed to that message (another first sequence number)."""
    sent = fill_orders(live, 12)
    if redelivered is not None:  # delivered once before, as after an earlier kill
        before = live.acquire_lease("orders", "before", 1, redelivered + 1)
        assert before is not None
        live.release_lease(before, hi=sent[redelivered - 1])  # no delivery counted
        live.settle_held("orders", [Abandon(sent[redelivered], before.lock_token)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    write = partition_writer(out)
    complete = Broker.complete_lease

    def killed(self: Broker, lease: Any, run: Any = None) -> int:
        raise Killed(f"killed before lease {lease.number} was completed")

    monkeypatch.setattr(Broker, "complete_lease", killed)
    options = {"maxMessagesPerBatch": "5", "lockDuration": "5"}
    query = start_stream(spark, url, checkpoint, foreach_batch(write), "kill", **options)
    try:
        with pytest.raises(Exception, match="killed before lease 1"):
            query.processAllAvailable()
    finally:
        query.stop()
    monkeypatch.setattr(Broker, "complete_lease", complete)
    # Batch 0 was written: 5 messages, or those before the one delivered before, which
    # gets a batch of its own (poisonq/spark/narrowing.py).
    assert spark.read.parquet(str(out)).count() == (redelivered or 5)
    if lock_runs_out:
        time.sleep(5.5)  # the restart comes after the lease's lock ran out

    query = start_stream(spark, url, checkpoint, foreach_batch(write), "kill", **options)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    ids = sorted(row.message_id for row in spark.read.parquet(str(out)).collect())
    assert ids == sorted(f"m{n}" for n in range(12))
    assert live.counts("orders")["completed"] == 12
    assert_balanced(live)
