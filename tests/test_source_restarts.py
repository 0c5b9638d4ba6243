"""A plain streaming query through the source (a Parquet sink, no ``foreach_batch``) that
dies on a poison row, restarted from its checkpoint in the same process: each restart
replays the failed batch narrowed, and the poison row costs a few restarts, not a bisection.

Spark's Python workers are separate processes on the real clock, so these tests open their
own broker on the system clock rather than the ``broker`` fixture.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import poisonq
from poisonq import Broker, Message
from poisonq.errors import InvalidOptionError
from poisonq.spark import run_restarting
from poisonq.spark.narrowing import NARROWING
from tests.helpers import assert_balanced, on_both_stores, spark_store_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

cloudpickle.register_pickle_by_value(sys.modules[__name__])

url = spark_store_url


@pytest.fixture
def live(url: str) -> Iterator[Broker]:
    """A broker on the real clock with a queue ``events`` (2 deliveries, 30 s lock)."""
    with poisonq.connect(url) as opened:
        opened.create_queue("events", max_delivery_count=2, lock_duration=30)
        yield opened


def send_events(broker: Broker, count: int, bad: int | None) -> list[int]:
    """``count`` sensor events with a timestamp; event number ``bad``'s cannot be cast."""
    stamps = ["2026-11-26 10:00:00"] * count
    if bad is not None:
        stamps[bad] = "26/11/2026 10h"
    bodies = [json.dumps({"n": n, "ts": ts}) for n, ts in enumerate(stamps)]
    return broker.sender("events").send([Message(body=body) for body in bodies])


def parquet_query(
    spark: SparkSession, url: str, tmp_path: Path, batch: int, **options: str
) -> Callable[[], StreamingQuery]:
    """What starts the trial's query: the events' timestamps cast (ANSI: a bad one fails the
    job) and appended to Parquet, ``trigger(availableNow=True)``, one checkpoint."""

    def start() -> StreamingQuery:
        events = (
            spark.readStream.format("poisonq")
            .option("url", url)
            .option("maxMessagesPerBatch", str(batch))
            .options(**options)
            .load("events")
        )
        body = F.col("body").cast("string")
        stamped = events.select(
            "sequence_number", F.get_json_object(body, "$.ts").cast("timestamp").alias("ts")
        )
        return (
            stamped.writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    return start


def restarts_allowed(batch: int, max_delivery_count: int) -> int:
    """The failure of the whole batch, one per narrowing level (a part of 1/NARROWING of the
    one before, down to one message), and one per further delivery of the poison row (each
    in a micro-batch of its own)."""
    return 1 + math.ceil(math.log(batch, NARROWING)) + (max_delivery_count - 1)


@on_both_stores
def test_a_plain_query_restarted_in_the_same_process_dead_letters_the_poison_in_a_few_restarts(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    seqs = send_events(live, 600, bad=250)
    poison = seqs[250]
    restarts = run_restarting(parquet_query(spark, url, tmp_path, batch=200))
    assert 1 <= restarts <= restarts_allowed(200, max_delivery_count=2)
    written = [row.sequence_number for row in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(written) == [seq for seq in seqs if seq != poison]  # each exactly once
    [dead] = live.peek("events/$deadletterqueue")
    assert (dead.sequence_number, dead.dead_letter_reason) == (poison, "MaxDeliveryCountExceeded")
    # One per delivery, each with the query's error: the cast, not "the query failed".
    assert [f.error_type for f in dead.failures] == ["BatchJobFailed"] * 2
    assert {f.fingerprint for f in dead.failures} == {"batch-job-failed:CAST_INVALID_INPUT"}
    assert "'26/11/2026 10h'" in dead.failures[-1].message
    assert live.counts("events")["completed"] == 599
    assert_balanced(live)


def _stamp(body: bytes) -> str:
    event = json.loads(body)
    if event["ts"] == "26/11/2026 10h":
        raise ValueError(f"event {event['n']}: no time in {event['ts']!r}")
    return str(event["ts"])


@pytest.mark.slow
def test_a_poison_row_restarted_past_carries_the_error_the_query_died_of(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Each failure a restart loop leaves on a poison row that failed its batch alone is the
    error the query died of (type and text, the Python worker's traceback, a fingerprint of
    the type and the frame that raised it), not a bare ``QueryFailed``: two rows raising in
    the same place share a group, and it is not the group of every failed query."""
    stamps = ["2026-11-26 10:00:00"] * 30
    stamps[4] = stamps[17] = "26/11/2026 10h"
    bodies = [json.dumps({"n": n, "ts": ts}) for n, ts in enumerate(stamps)]
    seqs = live.sender("events").send([Message(body=body) for body in bodies])

    def start() -> StreamingQuery:
        events = (
            spark.readStream.format("poisonq").option("url", url)
            .option("maxMessagesPerBatch", "10").load("events")
        )  # fmt: skip
        stamped = events.select(
            "sequence_number", F.udf(_stamp, "string", useArrow=False)("body").alias("ts")
        )
        return (
            stamped.writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True).start()
        )  # fmt: skip

    run_restarting(start)
    written = [row.sequence_number for row in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(written) == [seq for n, seq in enumerate(seqs) if n not in (4, 17)]
    dead = {m.sequence_number: m for m in live.peek("events/$deadletterqueue")}
    assert sorted(dead) == [seqs[4], seqs[17]]
    for n in (4, 17):
        failures = dead[seqs[n]].failures
        assert [f.error_type for f in failures] == ["BatchJobFailed"] * 2
        assert failures[-1].message == f"ValueError: event {n}: no time in '26/11/2026 10h'"
        assert "raise ValueError" in failures[-1].traceback
        fingerprints = {f.fingerprint for f in failures}
        assert fingerprints == {"batch-job-failed:ValueError@test_source_restarts.py:_stamp"}
    assert_balanced(live)


def test_a_restart_after_the_lock_ran_out_replays_the_batch_without_counting_deliveries(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """An availableNow run reads the queue before it replays the last run's batch, and a
    read takes back locks that ran out: the source resumes the batch's lease first."""
    seqs = send_events(live, 20, bad=5)
    start = parquet_query(spark, url, tmp_path, batch=20, lockDuration="2")
    with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
        run_restarting(start, max_restarts=0)
    time.sleep(2.5)  # the restart comes after the batch's locks ran out
    with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
        run_restarting(start, max_restarts=0)  # the replay's eighth (3) passed, the next failed
    messages = live.peek("events", max_messages=20)
    assert [m.sequence_number for m in messages] == seqs[3:]
    assert all(not m.failures for m in messages)  # no lock taken back, no delivery counted
    assert max(m.delivery_count for m in messages) == 1
    assert_balanced(live)


def test_a_clean_query_needs_no_restart_and_reads_full_batches(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    seqs = send_events(live, 50, bad=None)
    assert run_restarting(parquet_query(spark, url, tmp_path, batch=20)) == 0
    written = [row.sequence_number for row in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(written) == seqs
    leases = [live.lease("events", "spark", number) for number in (2, 3)]  # 1 is forgotten
    assert [lease.count for lease in leases if lease is not None] == [20, 10]
    assert_balanced(live)


def test_restarting_gives_up_after_max_restarts_with_the_query_s_error(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send_events(live, 10, bad=3)
    with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
        run_restarting(parquet_query(spark, url, tmp_path, batch=10), max_restarts=1)
    assert live.counts("events")["dead_lettered"] == 0  # nothing settled for the give-up
    assert_balanced(live)


def test_restarting_takes_a_function_that_starts_the_query() -> None:
    with pytest.raises(InvalidOptionError, match="function that starts the query"):
        run_restarting(None)  # type: ignore[arg-type]
