"""The Spark pipeline runner on a real local SparkSession and real SQLite files.

Spark's Python workers use the real clock, so these tests use a broker with the real clock.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

import poisonq
from poisonq import Broker, Message
from poisonq.spark.lease_renewer import LeaseRenewer
from poisonq.spark.pipeline import Pipeline
from poisonq.spark.reports import PipelineStoppedError
from tests.helpers import assert_balanced, dead_letters_by_id, on_both_stores, spark_store_url

# Executors cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InvalidCustomer(poisonq.PermanentError):
    pass


def transform(message: dict[str, Any]) -> dict[str, Any] | None:
    order = json.loads(message["body"])
    match order["kind"]:
        case "invalid":
            raise InvalidCustomer(f"order {order['n']}: no customer {order['customer']}")
        case "flaky" if message["delivery_count"] == 1:
            raise TimeoutError("database is locked")
        case "crash":
            os._exit(1)
        case "broken":
            raise ValueError(f"order {order['n']} cannot be booked")
        case "unfit":
            return {"n": "not a number", "customer": order["customer"]}
        case "skip":
            return None
    return {"n": order["n"], "customer": order["customer"]}


SCHEMA = "n long, customer string"


url = spark_store_url


def send(broker: Broker, kinds: dict[int, str], count: int, **queue: Any) -> None:
    broker.create_queue("orders", lock_duration=60, **queue)
    broker.sender("orders").send(
        [
            Message(
                body=json.dumps({"n": n, "customer": f"C{n}", "kind": kinds.get(n, "ok")}),
                message_id=f"o{n}",
            )
            for n in range(count)
        ]
    )


def output(spark: SparkSession, path: Path) -> Counter[int]:
    return Counter(row.n for row in spark.read.parquet(str(path)).select("n").collect())


@on_both_stores
def test_each_outcome_is_settled_by_what_the_transform_did(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    kinds = {3: "invalid", 5: "flaky", 8: "crash", 13: "unfit", 21: "skip", 34: "crash"}
    send(live, kinds, 40, max_delivery_count=2)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=25,
    )  # fmt: skip
    report = pipeline.run()

    assert output(spark, tmp_path / "out") == Counter(set(range(40)) - {3, 8, 13, 21, 34})
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o13", "o3", "o34", "o8"]
    invalid = live.message("orders/$deadletterqueue", letters["o3"].sequence_number)
    assert (invalid.dead_letter_reason, invalid.delivery_count) == ("InvalidCustomer", 1)
    assert "no customer C3" in (invalid.dead_letter_error_description or "")
    assert "Traceback" in invalid.failures[-1].traceback
    assert letters["o13"].dead_letter_reason == "OutputSchemaMismatch"
    for crashed in ("o8", "o34"):  # crashed twice: the retry policy poisoned it
        message = live.message("orders/$deadletterqueue", letters[crashed].sequence_number)
        assert message.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert [f.error_type for f in message.failures] == ["WorkerCrashed"] * 2
    assert report.dead_lettered == Counter(
        {"InvalidCustomer": 1, "OutputSchemaMismatch": 1, "MaxDeliveryCountExceeded": 2}
    )
    assert report.completed == 36  # 35 written, the skipped one completed without output
    assert report.isolation_jobs == 0  # crashes were isolated inside the tasks
    assert live.counts("orders")["completed"] == 36
    assert_balanced(live)

    # The timeline: a record per batch, which adds up to the report.
    batches = live.pipeline_batches("pipeline")
    first = batches[0]
    # The crasher o8 ran again in its batch and was poisoned there; the flaky o5 is retried.
    assert (first.lease, first.size, first.completed, first.retried) == (1, 25, 21, 1)
    assert first.dead_lettered == {
        "InvalidCustomer": 1,
        "OutputSchemaMismatch": 1,
        "MaxDeliveryCountExceeded": 1,
    }
    assert [b.lease for b in batches] == list(range(1, report.batches + 1))
    assert sum(b.size for b in batches) == report.leased
    assert sum(b.completed for b in batches) == report.completed
    assert sum(b.retried for b in batches) == report.retried
    assert sum((Counter(b.dead_lettered) for b in batches), Counter()) == report.dead_lettered
    assert all(b.seconds > 0 and b.isolation_jobs == 0 for b in batches)
    assert all(a.started_at + a.seconds <= b.started_at for a, b in itertools.pairwise(batches))


def died_after_writing_lease_1(live: Broker, pipeline: Pipeline) -> None:
    """What a driver leaves that wrote lease 1 (20 messages) and died before completing it:
    the lease locked, its output written, the failures of its batch settled."""
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20)
    assert lease is not None
    pipeline.writer.write_once(lease)


def test_a_restarted_pipeline_replays_its_lease_without_duplicating_output(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    send(live, {}, 30)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=20,
        lock_duration=2,  # a second to see that nothing renews the lease
    )  # fmt: skip
    died_after_writing_lease_1(live, pipeline)
    assert live.counts("orders")["locked"] == 20

    report = pipeline.run()
    assert report.batches == 2  # the replayed lease, then the rest
    assert [(b.lease, b.completed) for b in live.pipeline_batches("pipeline")] == [(1, 20), (2, 10)]
    assert output(spark, tmp_path / "out") == Counter(range(30))
    assert live.counts("orders")["completed"] == 30
    assert_balanced(live)


def _slow_first(message: dict[str, Any]) -> dict[str, Any] | None:
    if json.loads(message["body"])["n"] == 0:
        time.sleep(2.5)  # the batch outlasts what was left of the dead run's lock
    return transform(message)


def test_a_replayed_lease_is_renewed_before_its_batch_runs(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A replayed lease is renewed for a whole lock before its batch runs: a batch that
    outlasts what was left of the dead run's lock still completes its lease, and every row
    is written once."""
    send(live, {}, 30)
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20, lock_duration=4.5)
    assert lease is not None  # and the run that took it died at once
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_slow_first, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=20, lock_duration=6,
    )  # fmt: skip
    report = pipeline.run()
    assert [(b.lease, b.completed) for b in live.pipeline_batches("pipeline")] == [(1, 20), (2, 10)]
    assert output(spark, tmp_path / "out") == Counter(range(30))
    assert report.completed == 30 and live.counts("orders")["completed"] == 30
    assert_balanced(live)


def _with_delivery(message: dict[str, Any]) -> dict[str, Any]:
    return {"n": json.loads(message["body"])["n"], "customer": str(message["delivery_count"])}


@on_both_stores
def test_a_lease_whose_lock_runs_out_while_the_next_run_watches_it_is_replayed(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A lease left locked by a run that stopped (Ctrl-C, a kill) is replayed by the next
    run even when its lock runs out while that run watches it for a renewal: nothing took
    its messages back meanwhile, so they are revived, and come again with no delivery
    counted, not in a later lease as a lock expiry's redelivery."""
    send(live, {}, 30)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_with_delivery, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=20,
        lock_duration=8,  # watched for 4 s, past the dead run's lock
    )  # fmt: skip
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20, lock_duration=2)
    assert lease is not None  # and the run that took it stopped at once

    report = pipeline.run()
    assert [(b.lease, b.completed) for b in live.pipeline_batches("pipeline")] == [(1, 20), (2, 10)]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert Counter(row.n for row in rows) == Counter(range(30))
    assert {row.customer for row in rows} == {"1"}  # each delivered once
    assert report.completed == 30 and report.retried == 0
    assert_balanced(live)


@on_both_stores
def test_a_replays_report_counts_only_what_its_lease_still_held(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A replayed lease counts in the run's report (and its timeline) as the messages it
    still held: those the dead run settled before it died are neither leased nor retried
    by this run."""
    send(live, {3: "invalid", 7: "invalid"}, 30)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=20,
    )  # fmt: skip
    died_after_writing_lease_1(live, pipeline)  # dead-lettering its two bad orders
    assert live.counts("orders")["dead_lettered"] == 2

    report = pipeline.run()
    assert (report.leased, report.completed, report.retried) == (28, 28, 0)
    assert not report.dead_lettered  # the dead run's, not this one's
    first = live.pipeline_batches("pipeline")[0]
    assert (first.lease, first.size, first.completed, first.retried) == (1, 18, 18, 0)
    assert output(spark, tmp_path / "out") == Counter(set(range(30)) - {3, 7})
    assert_balanced(live)


def forgetful(log_file: Path, skip_all: bool) -> Any:
    """A per-row function that returns None for every order if ``skip_all`` (a missing
    ``return``), else for the odd ones (filtering on purpose). It sends the warnings of the
    module that runs it in the executor to ``log_file``."""

    def parse(message: dict[str, Any]) -> dict[str, Any] | None:
        logger = logging.getLogger("poisonq.spark.transform")
        for old in logger.handlers:
            old.close()
        logger.handlers[:] = [logging.FileHandler(log_file)]
        order = json.loads(message["body"])
        if skip_all or order["n"] % 2:
            return None
        return {"n": order["n"], "customer": order["customer"]}

    return parse


@pytest.mark.parametrize("skip_all", [True, False])
def test_a_function_returning_none_for_a_whole_batch_completes_it_with_a_warning(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path, skip_all: bool
) -> None:
    """None completes a message with no row; a per-row function that returns None for every
    message of a batch (of at least ten) is warned about once per batch by the executor, as
    a missing ``return`` looks the same. Filtering some of them is not."""
    send(live, {}, 30)
    log_file = tmp_path / "executor.log"
    report = Pipeline(
        spark, url=url, queue="orders", map=forgetful(log_file, skip_all), schema=SCHEMA,
        output=str(tmp_path / "out"), isolate=False,  # the function logs where apply runs
    ).run()  # fmt: skip
    assert report.completed == 30 and not report.dead_lettered
    warnings = log_file.read_text().splitlines() if log_file.exists() else []
    if skip_all:
        [warning] = warnings
        assert warning.startswith("map function forgetful.<locals>.parse returned None")
        assert "each of this batch's 30 message(s)" in warning
    else:
        assert warnings == []
        assert output(spark, tmp_path / "out") == Counter(range(0, 30, 2))
    assert_balanced(live)


def test_a_second_run_of_a_busy_consumer_stops_and_leaves_the_first_runs_output(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A run of a consumer whose lease another live run keeps renewing stops without
    replaying that lease: the live run's output and locks stay as they were."""
    send(live, {}, 30)
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20, lock_duration=3)
    assert lease is not None
    with LeaseRenewer(live, lease, 3):  # the first run, still going
        pipeline = Pipeline(
            spark, url=url, queue="orders", map=transform, schema=SCHEMA,
            output=str(tmp_path / "out"), batch_size=20, lock_duration=3,
        )  # fmt: skip
        pipeline.writer.write_once(lease)
        with pytest.raises(PipelineStoppedError, match="another"):
            pipeline.run()
    assert output(spark, tmp_path / "out") == Counter(range(20))  # its output kept
    assert len(live.lease_sequence_numbers(lease)) == 20  # still the first run's
    assert_balanced(live)


def test_a_bug_in_small_batches_that_retries_its_failures_says_they_come_again(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A defect shown across small batches whose failures are not permanent says the failed
    messages are back in the queue to come again, and points to no dead-letter queue."""
    send(live, dict.fromkeys(range(40), "broken"), 40)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=5,
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="back in the queue") as stopped:
        pipeline.run()
    assert "resubmit" not in str(stopped.value)
    assert not dead_letters_by_id(live)
    assert_balanced(live)


def test_an_output_that_cannot_be_written_stops_a_replay_in_one_line(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A dead run's lease output that cannot be discarded stops the run with one line
    naming the lease, and spends no delivery."""
    send(live, {}, 10)
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=10, lock_duration=1)
    assert lease is not None
    time.sleep(1.2)  # the run that took it died and stayed down past its lock
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output="/proc/poisonq-nowhere",
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="cannot write the output of lease 1"):
        pipeline.run()
    assert live.counts("orders")["active"] == 10  # nothing spent
    assert_balanced(live)


def test_a_lease_whose_locks_ran_out_before_completion_leaves_no_duplicate_output(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """The output a dead run wrote for a lease whose locks ran out before it was completed
    is discarded: its messages, leased again, are written once."""
    send(live, {}, 30)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=20,
    )  # fmt: skip
    lease = live.acquire_lease("orders", "pipeline", 1, max_messages=20, lock_duration=1)
    assert lease is not None
    pipeline.writer.write_once(lease)  # then the driver died
    time.sleep(1.2)  # and stayed down past the lease's locks
    report = pipeline.run()
    assert output(spark, tmp_path / "out") == Counter(range(30))
    assert report.completed == 30 and live.counts("orders")["completed"] == 30
    assert live.lease("orders", "pipeline") is not None
    assert_balanced(live)


def test_a_batch_that_fails_as_a_whole_is_bisected_to_the_guilty_messages(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    n, guilty = 16, {4, 11}
    send(live, dict.fromkeys(guilty, "crash"), n, max_delivery_count=1)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=n, isolate=False,
    )  # fmt: skip
    report = pipeline.run()

    assert 0 < report.isolation_jobs <= 2 * len(guilty) * math.ceil(math.log2(n))
    [batch] = live.pipeline_batches("pipeline")
    assert (batch.isolation_jobs, batch.completed) == (report.isolation_jobs, n - len(guilty))
    assert batch.dead_lettered == {"MaxDeliveryCountExceeded": len(guilty)}
    assert output(spark, tmp_path / "out") == Counter(set(range(n)) - guilty)
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o11", "o4"]
    failure = live.message("orders/$deadletterqueue", letters["o4"].sequence_number).failures[-1]
    assert failure.error_type == "WorkerCrashed"
    assert_balanced(live)


def test_a_broken_sink_stops_the_pipeline_and_spends_nothing(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A sink that cannot be written fails every job, whatever its messages: the first and
    the last message fail alone the same way, so the runner stops after two probes instead
    of bisecting, and gives the messages back without a delivery counted."""
    n = 200
    send(live, {}, n)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), output_format="no-such-format",
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="a defect, not poison") as stopped:
        pipeline.run()
    assert stopped.value.report.isolation_jobs == 2
    assert stopped.value.defect is not None
    assert stopped.value.defect.failure.error_type == "BatchJobFailed"
    assert "no-such-format" in stopped.value.traceback
    counts = live.counts("orders")
    assert (counts["active"], counts["completed"], counts["dead_lettered"]) == (n, 0, 0)
    assert {m.delivery_count for m in live.peek("orders", max_messages=n)} == {0}
    assert_balanced(live)


def test_bad_options_are_refused(spark: SparkSession, url: str) -> None:
    with pytest.raises(poisonq.InvalidOptionError, match="batch_size"):
        Pipeline(spark, url=url, queue="orders", map=transform, schema=SCHEMA,
                 output="out", batch_size=0)  # fmt: skip
    with pytest.raises(poisonq.InvalidOptionError, match="keep_batches"):
        Pipeline(spark, url=url, queue="orders", map=transform, schema=SCHEMA,
                 output="out", keep_batches=0)  # fmt: skip


def test_retry_cycles_keep_the_leases_going_and_a_fault_stops_the_pipeline_with_a_report(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A flaky message waits out a retry cycle (delay 0) and succeeds in a later lease; a
    queue that faults on a poison message stops the runner with the fault, not a spin."""
    cycles = poisonq.RetryPolicy(receive_retry_count=0, max_retry_cycles=1)
    send(live, {2: "flaky"}, 10, retry=cycles)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=10,
    )  # fmt: skip
    report = pipeline.run()
    assert output(spark, tmp_path / "out") == Counter(range(10))
    assert (report.completed, report.retried) == (10, 1)
    assert live.counts("orders")["completed"] == 10

    fault = poisonq.RetryPolicy(receive_retry_count=0, receive_error_handling="fault")  # type: ignore[arg-type]
    live.update_queue("orders", retry=fault)
    (bad,) = live.sender("orders").send(
        Message(body=json.dumps({"n": 99, "customer": "C", "kind": "flaky"}))
    )
    with pytest.raises(PipelineStoppedError) as caught:
        pipeline.run()
    assert isinstance(caught.value.cause, poisonq.PoisonMessageError)
    assert caught.value.cause.sequence_number == bad
    assert caught.value.report.retried == 1
    assert live.counts("orders")["active"] == 1  # the poison message waits for an operator
    assert_balanced(live)


def test_a_returned_row_that_does_not_fit_is_dead_lettered_never_completed_silently(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A returned tuple, list or Row is taken by position and a dict by name; a row that
    does not fit the schema (a field missing, one too many, a lossy type, not a row at all)
    dead-letters its message ``OutputSchemaMismatch`` with what was wrong, never a null or a
    silent completion."""
    from pyspark.sql import Row

    returns: dict[int, Any] = {
        1: (1, "C1"),  # by position: written
        2: Row(n=2, customer="C2"),  # by name: written
        3: ("too", "many", "values"),
        4: {"n": 4},  # missing customer
        5: {"n": 5, "customer": "C5", "note": "extra"},
        6: {"n": 6.5, "customer": "C6"},  # lossy
        7: "n=7",
    }

    def shaped(message: dict[str, Any]) -> Any:
        n = json.loads(message["body"])["n"]
        return returns.get(n, {"n": n, "customer": f"C{n}"})

    send(live, {}, 30)
    report = Pipeline(
        spark, url=url, queue="orders", map=shaped, schema=SCHEMA,
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert output(spark, tmp_path / "out") == Counter(set(range(30)) - {3, 4, 5, 6, 7})
    assert report.dead_lettered == Counter({"OutputSchemaMismatch": 5})
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o3", "o4", "o5", "o6", "o7"]
    missing = live.message("orders/$deadletterqueue", letters["o4"].sequence_number)
    assert "missing field(s) customer" in (missing.dead_letter_error_description or "")
    assert missing.failures[-1].fingerprint and "{'n': 4}" in missing.failures[-1].traceback
    assert_balanced(live)


def test_consumers_sharing_an_output_never_overwrite_each_other(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Leases are numbered per consumer and each consumer's output has its own directory:
    a second consumer's lease 1 lands beside the first one's."""
    send(live, {}, 20)
    out = tmp_path / "out"
    for consumer in ("nightly", "pipeline"):
        Pipeline(
            spark, url=url, queue="orders", map=transform, schema=SCHEMA,
            output=str(out), consumer=consumer, batch_size=10,
        ).run(max_batches=1)  # fmt: skip
    assert output(spark, out) == Counter(range(20))
    assert sorted(p.name for p in out.iterdir()) == ["consumer=nightly", "consumer=pipeline"]
    assert live.counts("orders")["completed"] == 20
    assert_balanced(live)


def _name_error(message: dict[str, Any]) -> dict[str, Any]:
    return {"n": totl}  # type: ignore[name-defined]  # noqa: F821  # the user's bug


def _wrong_type(message: dict[str, Any]) -> dict[str, Any]:
    return {"n": "1", "customer": "C"}


def test_a_function_of_one_message_runs_under_the_crash_guard_from_the_first_batch(
    spark: SparkSession,
    live: Broker,
    url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first crash of a run fails no Spark job: the guard is on from the start, so the
    batch is written once and only its crasher is abandoned."""
    send(live, {0: "crash"}, 10, max_delivery_count=1)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="poisonq.spark.batch_writer"):
        report = pipeline.run()
    assert not [r for r in caplog.records if "worker died" in r.getMessage()]
    assert output(spark, tmp_path / "out") == Counter(range(1, 10))
    assert report.dead_lettered == Counter({"MaxDeliveryCountExceeded": 1})
    assert report.isolation_jobs == 0
    assert_balanced(live)


@on_both_stores
def test_redeliveries_fold_into_the_next_lease_once_the_queue_holds_less_than_a_batch(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A lease that would not be full is not taken while the batch before it runs, but
    after, so it carries what that batch gave back: two failing messages from the two full
    batches come back together, one batch per delivery left (4 batches, not one more for
    each one's every redelivery), and each is still dead-lettered after its third failure."""
    send(live, {3: "broken", 13: "broken"}, 25, max_delivery_count=3)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=10,
    )  # fmt: skip
    report = pipeline.run()

    batches = live.pipeline_batches("pipeline")
    assert [b.size for b in batches][:2] == [10, 10]  # then the rest, and the crashers
    assert report.batches == len(batches) == 4
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o13", "o3"]
    for broken in letters.values():
        message = live.message("orders/$deadletterqueue", broken.sequence_number)
        assert message.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert [f.error_type for f in message.failures] == ["ValueError"] * 3
    assert output(spark, tmp_path / "out") == Counter(set(range(25)) - {3, 13})
    assert_balanced(live)


def _crashes_twice(message: dict[str, Any]) -> dict[str, Any] | None:
    """``transform``, but order 5 crashes its worker on its first two deliveries."""
    if b'"n": 5,' in message["body"] and message["delivery_count"] < 3:
        os._exit(1)
    return transform(message)


@on_both_stores
def test_a_message_that_crashes_the_worker_runs_again_within_its_batch(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A crasher the retry policy returns at once is taken back into its lease and run again
    in the same task, each crash counting a delivery, until it passes or is poisoned: no
    batch of its own comes after. Order 5 passes on its third delivery and is written once;
    order 3 crashes every time and is dead-lettered after its third."""
    send(live, {3: "crash"}, 10, max_delivery_count=3)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_crashes_twice, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=10,
    )  # fmt: skip
    report = pipeline.run()

    assert report.batches == 1
    assert output(spark, tmp_path / "out") == Counter(set(range(10)) - {3})
    [letter] = dead_letters_by_id(live).values()
    assert (letter.message_id, letter.dead_letter_reason, letter.delivery_count) == (
        "o3",
        "MaxDeliveryCountExceeded",
        3,
    )
    assert [f.error_type for f in letter.failures] == ["WorkerCrashed"] * 3
    [batch] = live.pipeline_batches("pipeline")
    assert (batch.completed, batch.retried) == (9, 0)
    assert batch.dead_lettered == {"MaxDeliveryCountExceeded": 1}
    assert report.isolation_jobs == 0
    assert_balanced(live)


def _always_crashes(message: dict[str, Any]) -> dict[str, Any]:
    os._exit(3)


@on_both_stores
@pytest.mark.parametrize(
    ("defect", "error_type"),
    [(_name_error, "NameError"), (_wrong_type, "OutputSchemaMismatch")],
)
def test_a_bug_that_fails_every_message_stops_the_runner_and_spends_nothing(
    spark: SparkSession,
    live: Broker,
    url: str,
    tmp_path: Path,
    defect: Any,
    error_type: str,
) -> None:
    """A bug that fails every message the same way (an exception, a row of the wrong type)
    is a defect: the runner stops, gives the batch back without a delivery counted, writes
    no row for it (an output of the schema that Spark reads as empty), and names the bug
    with its traceback."""
    send(live, {}, 100, max_delivery_count=1)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=defect, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="100 of 100 messages failed") as stopped:
        pipeline.run()
    found = stopped.value.defect
    assert found is not None and found.failure.error_type == error_type
    assert found.failure.fingerprint
    if error_type == "NameError":  # the traceback starts at the user's frame
        assert stopped.value.traceback.splitlines()[1].endswith("in _name_error")
    counts = live.counts("orders")
    assert (counts["active"], counts["dead_lettered"], counts["completed"]) == (100, 0, 0)
    assert {m.delivery_count for m in live.peek("orders", max_messages=100)} == {0}
    assert spark.read.parquet(str(tmp_path / "out" / "consumer=pipeline" / "lease=1")).count() == 0
    assert_balanced(live)


def _needs_a_missing_module(message: dict[str, Any]) -> dict[str, Any]:
    __import__("poisonq_no_such_module")
    return {}


def test_a_module_the_workers_cannot_import_stops_the_runner_with_the_interpreter_hint(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A function that fails every message importing a module the Python workers lack (the
    interpreter PYSPARK_PYTHON names is not the driver's) stops the runner as a defect whose
    message says which interpreter the workers run and how to change it."""
    send(live, {}, 20)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_needs_a_missing_module, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError) as stopped:
        pipeline.run()
    assert "cannot import 'poisonq_no_such_module'" in str(stopped.value)
    assert "PYSPARK_PYTHON" in str(stopped.value) and sys.executable in str(stopped.value)
    assert live.counts("orders")["active"] == 20
    assert_balanced(live)


def test_a_transform_that_always_crashes_the_worker_is_a_defect(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A function that crashes its worker on every message is a defect, not poison: the
    runner stops and spends no delivery."""
    send(live, {}, 40, max_delivery_count=1)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_always_crashes, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError) as stopped:
        pipeline.run()
    assert stopped.value.defect is not None
    assert stopped.value.defect.failure.error_type == "WorkerCrashed"
    assert live.counts("orders")["active"] == 40
    assert_balanced(live)


@on_both_stores
def test_crashes_in_most_of_a_small_batch_are_not_run_again_within_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A function that crashes on every message, in batches too small to tell a defect
    alone, crashes more of each batch than poison does (the defect ratio): its messages are
    not run again within the batch, which would spend every delivery of good messages and
    dead-letter them; each is abandoned once, and the run's defect check across batches
    stops it."""
    send(live, {}, 30, max_delivery_count=10)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=_always_crashes, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=5,
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError) as stopped:
        pipeline.run()
    assert stopped.value.defect is not None
    assert live.counts("orders")["dead_lettered"] == 0
    assert max(m.delivery_count for m in live.peek("orders", max_messages=30)) == 1
    assert_balanced(live)


def test_a_broadcast_variable_in_the_transform_stops_the_runner_and_spends_nothing(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A broadcast variable used in a function of one message fails every job the same way
    (a defect): the runner stops after its probes and spends no delivery."""
    customers = spark.sparkContext.broadcast({"C1": "Ada"})

    def with_broadcast(message: dict[str, Any]) -> dict[str, Any]:
        n = json.loads(message["body"])["n"]
        return {"n": n, "customer": customers.value.get(f"C{n}", "?")}

    send(live, {}, 30, max_delivery_count=1)
    pipeline = Pipeline(
        spark, url=url, queue="orders", map=with_broadcast, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="a defect, not poison"):
        pipeline.run()
    counts = live.counts("orders")
    assert (counts["active"], counts["dead_lettered"]) == (30, 0)
    assert {m.delivery_count for m in live.peek("orders", max_messages=30)} == {0}
    assert_balanced(live)


def test_poison_below_the_failure_ratio_is_dead_lettered(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A third of a batch failing with one fingerprint is poison, not a defect."""
    send(live, {n: "invalid" for n in range(0, 60, 3)}, 60)
    report = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.dead_lettered == Counter({"InvalidCustomer": 20})
    assert output(spark, tmp_path / "out") == Counter(n for n in range(60) if n % 3)
    assert_balanced(live)


def test_poison_coming_back_together_is_not_a_defect(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Poison messages retried together in a batch of their own, all failing the same way,
    are not a defect: only first deliveries tell one, so they run out their deliveries and
    are dead-lettered."""
    bad = set(range(5, 200, 16))  # 12 messages that always fail
    send(live, dict.fromkeys(bad, "broken"), 200, max_delivery_count=3)
    report = Pipeline(
        spark, url=url, queue="orders", map=transform, schema=SCHEMA,
        output=str(tmp_path / "out"), batch_size=200,
    ).run()  # fmt: skip
    assert report.dead_lettered == Counter({"MaxDeliveryCountExceeded": len(bad)})
    assert output(spark, tmp_path / "out") == Counter(set(range(200)) - bad)
    assert_balanced(live)
