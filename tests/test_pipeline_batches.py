"""The pipeline runner with ``map_batches=``, a function of an Arrow batch of messages, on a
real local SparkSession and real SQLite files (PostgreSQL where marked)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

import poisonq
from poisonq import Broker, Message
from poisonq.errors import InvalidOptionError
from poisonq.spark import Pipeline, PipelineStoppedError
from tests.helpers import assert_balanced, dead_letters_by_id, on_both_stores, spark_store_url

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "n long, customer string"
url = spark_store_url


def orders(batch: pa.RecordBatch) -> tuple[pa.Table, list[Any]]:
    """Each order's rows and error, as a batch function tells them, each row carrying the
    ``sequence_number`` of its order: ``invalid`` fails with a permanent exception,
    ``refused`` with a text, ``flaky`` with a transient exception on its first delivery (all
    three with a row, which is not written); ``skip`` has no row, ``double`` two."""
    rows: list[dict[str, Any]] = []
    errors: list[Any] = []
    seqs = batch.column("sequence_number").to_pylist()
    bodies = batch.column("body").to_pylist()
    deliveries = batch.column("delivery_count").to_pylist()
    for seq, body, delivery in zip(seqs, bodies, deliveries, strict=True):
        order = json.loads(body)
        row = {"sequence_number": seq, "n": order["n"], "customer": f"C{order['n']}"}
        error: Any = None
        match order["kind"]:
            case "invalid":
                error = poisonq.PermanentError(f"order {order['n']}: no such customer")
            case "refused":
                error = f"order {order['n']} is over the limit"
            case "flaky" if delivery == 1:
                error = TimeoutError("customer service timed out")
            case "skip":
                row = {}
            case "double":
                rows.append({**row, "customer": "first"})
                row = {**row, "customer": "second"}
        if row:
            rows.append(row)
        errors.append(error)
    return pa.Table.from_pylist(rows), errors


def one_row_each(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
    """Vectorized: one row per order, each with its message's sequence_number, and an error
    where the order's kind is ``refused`` (a text, which is rejected)."""
    orders = pa.Table.from_pylist([json.loads(body) for body in batch.column("body").to_pylist()])
    refused = pc.equal(orders.column("kind"), "refused")
    rows = orders.select(["n"]).append_column("customer", orders.column("kind"))
    rows = rows.append_column("sequence_number", batch.column("sequence_number"))
    return rows, pc.if_else(refused, "refused by the shop", None)


def sorted_untied(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
    """A row per order with no sequence_number, sorted (as a sort or a join reorders
    rows), and an error where the order's kind is ``refused``."""
    rows, errors = one_row_each(batch)
    return rows.drop_columns(["sequence_number"]).sort_by([("n", "descending")]), errors


def errors_of_length(count: int) -> Any:
    """A batch function whose errors list has ``count`` entries, whatever its batch."""

    def short_errors(batch: pa.RecordBatch) -> tuple[pa.Table, list[None]]:
        bodies = batch.column("body").to_pylist()
        return pa.Table.from_pylist([{"n": json.loads(b)["n"]} for b in bodies]), [None] * count

    return short_errors


def filtered_untied(batch: pa.RecordBatch) -> tuple[pa.Table, list[Any]]:
    """Rows for the good orders only, with no sequence_number to say whose they are."""
    orders = [json.loads(body) for body in batch.column("body").to_pylist()]
    errors = [None if o["kind"] == "ok" else "refused" for o in orders]
    return pa.Table.from_pylist([{"n": o["n"]} for o in orders if o["kind"] == "ok"]), errors


def blank_for_good(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
    """A row per order, tied, and pandas' habit for "no error": ``""`` for a good order."""
    rows, errors = one_row_each(batch)
    return rows, pc.fill_null(errors, "")


def kept_orders(log_file: Path, tie: bool) -> Any:
    """A batch function returning rows for the ``ok`` orders only and no errors, tied by
    ``sequence_number`` if ``tie``. It sends the warnings of the module that runs it in the
    executor to ``log_file`` (an executor's logs are not the test's; the handler replaces
    any that an earlier test left in a reused Python worker)."""

    def kept(batch: pa.RecordBatch) -> pa.Table:
        logger = logging.getLogger("poisonq.spark.batches")
        for old in logger.handlers:
            old.close()
        logger.handlers[:] = [logging.FileHandler(log_file)]
        orders = pa.Table.from_pylist([json.loads(b) for b in batch.column("body").to_pylist()])
        orders = orders.append_column("sequence_number", batch.column("sequence_number"))
        ok = orders.filter(pc.equal(orders.column("kind"), "ok"))
        return ok.select(["n", "sequence_number"] if tie else ["n"])

    return kept


def quantities(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Vectorized, as mapInArrow code is: a quantity that is not a number makes the cast
    raise for the whole batch; a quantity of "crash" kills the worker."""
    parsed = [json.loads(body) for body in batch.column("body").to_pylist()]
    if any(order["qty"] == "crash" for order in parsed):
        os._exit(3)
    qty = pc.cast(pa.array([order["qty"] for order in parsed]), pa.int64())
    return pa.RecordBatch.from_arrays(
        [pa.array([order["n"] for order in parsed]), qty], ["n", "qty"]
    )


def send(broker: Broker, bodies: dict[int, dict[str, Any]], count: int, **queue: Any) -> None:
    broker.create_queue("orders", lock_duration=60, **queue)
    broker.sender("orders").send(
        [
            Message(
                body=json.dumps({"n": n, "kind": "ok", "qty": str(n), **bodies.get(n, {})}),
                message_id=f"o{n}",
            )
            for n in range(count)
        ]
    )


def written(spark: SparkSession, path: Path) -> Counter[int]:
    return Counter(row.n for row in spark.read.parquet(str(path)).select("n").collect())


@on_both_stores
def test_each_message_is_settled_by_the_error_the_function_returns_for_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A returned exception decides by its type (permanent: dead-lettered; else retried), a
    returned text is a rejection (dead-lettered), no error completes the message with its
    rows, however many (none included)."""
    kinds = {3: "invalid", 5: "refused", 7: "flaky", 9: "skip", 11: "double"}
    send(live, {n: {"kind": kind} for n, kind in kinds.items()}, 20)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=orders, schema=SCHEMA,
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.dead_lettered == {"PermanentError": 1, "Rejected": 1}
    assert report.retried == 1 and report.isolation_jobs == 0
    letters = dead_letters_by_id(live)
    assert sorted(letters) == ["o3", "o5"]
    assert letters["o5"].dead_letter_error_description.endswith(
        "Rejected: order 5 is over the limit"
    )
    expected = Counter(set(range(20)) - {3, 5, 9}) + Counter({11: 1})
    assert written(spark, tmp_path / "out") == expected
    assert live.counts("orders")["completed"] == 18
    assert_balanced(live)


def test_an_exception_for_the_whole_batch_is_traced_to_the_messages_that_raise_it_alone(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A batch function that raises for its whole batch is called again on halves of it, in
    the same worker and with no Spark job, until the messages that raise alone are found:
    only they fail (here dead-lettered, their type being permanent), every other row is
    written."""
    bad = {6, 37}
    send(live, {n: {"qty": "many"} for n in bad}, 60)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, qty long",
        output=str(tmp_path / "out"), permanent=(pa.ArrowInvalid,),
    ).run()  # fmt: skip
    assert report.isolation_jobs == 0
    assert sorted(dead_letters_by_id(live)) == ["o37", "o6"]
    assert report.dead_lettered == {"ArrowInvalid": 2}
    assert written(spark, tmp_path / "out") == Counter(set(range(60)) - bad)
    assert_balanced(live)


def two_faults(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Raises for the whole batch: a ``KeyError`` where an order has no customer, else a
    ``TypeError`` where its quantity is a list."""
    parsed = [json.loads(body) for body in batch.column("body").to_pylist()]
    for order in parsed:
        if order["kind"] == "nobody":
            raise KeyError(f"order {order['n']}: no customer")
    for order in parsed:
        if isinstance(order["qty"], list):
            raise TypeError(f"order {order['n']}: a list for a quantity")
    return pa.RecordBatch.from_pylist([{"n": order["n"]} for order in parsed])


def test_a_message_found_raising_alone_is_settled_by_its_own_exception_not_an_earlier_ones(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Each message traced to a batch function's exception is settled by the exception its
    own call raised: an exception another part of the batch raised earlier in the search is
    not its cause (neither its reason nor a "During handling" link of its traceback)."""
    send(live, {3: {"kind": "nobody"}, 15: {"qty": [1, 2]}}, 20)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=two_faults, schema="n long",
        output=str(tmp_path / "out"), permanent=(KeyError, TypeError),
    ).run()  # fmt: skip
    assert report.dead_lettered == {"KeyError": 1, "TypeError": 1}
    letters = dead_letters_by_id(live)
    assert (letters["o3"].dead_letter_reason, letters["o15"].dead_letter_reason) == (
        "KeyError",
        "TypeError",
    )
    failure = live.message("orders/$deadletterqueue", letters["o15"].sequence_number).failures[-1]
    assert "KeyError" not in failure.traceback
    assert written(spark, tmp_path / "out") == Counter(set(range(20)) - {3, 15})
    assert_balanced(live)


def test_rows_that_do_not_fit_the_schema_fail_their_message_or_stop_a_broken_function(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A value that does not cast safely to its column fails only its message
    (``OutputSchemaMismatch``, dead-lettered); rows that fit no message (a column missing)
    are a defect: the run stops and spends no delivery."""
    send(live, {4: {"qty": str(2**40)}}, 30)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, qty int",
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.dead_lettered == {"OutputSchemaMismatch": 1}
    assert sorted(dead_letters_by_id(live)) == ["o4"]

    live.delete_queue("orders")
    send(live, {}, 30)
    missing = Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, price double",
        output=str(tmp_path / "out2"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match=r"no column.* price") as stopped:
        missing.run()
    assert stopped.value.report.dead_lettered == {}
    assert live.counts("orders")["active"] == 30
    assert {m.delivery_count for m in live.peek("orders", max_messages=30)} == {0}
    assert_balanced(live)


def test_a_row_that_does_not_fit_is_recorded_by_the_schema_as_a_per_row_functions_is(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A message whose rows do not fit the schema has the failure a per-row function's has:
    type ``OutputSchemaMismatch``, and for a traceback the mismatch and the schema, not the
    frames of poisonq's own checks."""
    send(live, {4: {"qty": str(2**40)}}, 30)
    Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, qty int",
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    [dead] = dead_letters_by_id(live).values()
    failure = live.message("orders/$deadletterqueue", dead.sequence_number).failures[-1]
    assert failure.error_type == "OutputSchemaMismatch"
    assert failure.traceback.startswith("OutputSchemaMismatch: the rows do not cast")
    assert failure.traceback.endswith("the output schema is: struct<n:bigint,qty:int>")
    assert_balanced(live)


def test_a_crash_in_a_batch_function_turns_the_crash_guard_on_and_costs_only_its_message(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A Python worker killed by a batch function has its batch written again under the
    crash guard, which calls the function one message at a time in a child process: the
    crashing message is abandoned ``WorkerCrashed`` (dead-lettered here, one delivery
    allowed) and every other row is written."""
    send(live, {8: {"qty": "crash"}}, 25, max_delivery_count=1)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, qty long",
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert sorted(dead_letters_by_id(live)) == ["o8"]
    failure = live.message(
        "orders/$deadletterqueue", dead_letters_by_id(live)["o8"].sequence_number
    )
    assert failure.failures[-1].error_type == "WorkerCrashed"
    assert report.completed == 24
    assert written(spark, tmp_path / "out") == Counter(set(range(25)) - {8})
    assert_balanced(live)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"map_batches": orders}, "map_batches= needs schema="),
        ({"map_batches": orders, "map": len, "schema": SCHEMA}, "given map= and map_batches="),
        (
            {"map_batches": orders, "schema": SCHEMA, "expectations": {"x": "n > 0"}},
            r"the rows of map_batches= are checked against schema=, and for anything else it"
            r" can return \(rows, errors\)",
        ),
    ],
)
def test_a_batch_function_takes_the_options_of_a_function_of_messages(
    spark: SparkSession, url: str, tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    """``map_batches=`` needs ``schema=`` and takes no expectations (refused with how a batch
    function rejects a message: an entry of its errors); only one kind of function is
    given."""
    with pytest.raises(InvalidOptionError, match=message):
        Pipeline(spark, url=url, queue="orders", output=str(tmp_path / "out"), **arguments)


@pytest.mark.parametrize("count", [1, 2])
def test_an_errors_list_of_the_wrong_length_stops_the_run_as_the_functions_defect(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path, count: int
) -> None:
    """Errors of another count than the batch's messages are the function's defect, not
    poison: the run stops at once with a ``BatchFunctionError`` naming the function and both
    lengths, never bisecting the batch (where a part of the right size would pass), and the
    lease is given back with no message settled and no delivery counted."""
    send(live, {}, 30)
    run = Pipeline(
        spark, url=url, queue="orders", map_batches=errors_of_length(count), schema="n long",
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError) as stopped:
        run.run()
    assert f"short_errors returned {count} error(s) for a batch of 30 message(s)" in str(
        stopped.value
    )
    assert stopped.value.defect is not None
    assert stopped.value.defect.failure.error_type == "BatchFunctionError"
    assert stopped.value.report.dead_lettered == {} and stopped.value.report.isolation_jobs == 0
    assert live.counts("orders")["active"] == 30
    assert {m.delivery_count for m in live.peek("orders", max_messages=30)} == {0}
    assert_balanced(live)


def test_the_rows_of_a_message_failed_by_its_error_are_left_out_and_the_others_written(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """Rows returned with errors are tied to their messages by ``sequence_number``: the row
    of a message given an error is left out, the others are written."""
    refused = {2, 13, 21}
    send(live, {n: {"kind": "refused"} for n in refused}, 25)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=one_row_each, schema=SCHEMA,
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.dead_lettered == {"Rejected": 3}
    assert written(spark, tmp_path / "out") == Counter(set(range(25)) - refused)
    assert_balanced(live)


@pytest.mark.parametrize(
    ("function", "problem"),
    [
        (
            filtered_untied,
            r"filtered_untied returned 8 row\(s\) and an error per message with no sequence_",
        ),
        (
            sorted_untied,
            r"sorted_untied returned 10 row\(s\) and an error per message with no sequence_",
        ),
        (
            lambda batch: (
                pa.table({"sequence_number": pc.cast(batch.column(0), pa.string())}),
                [None] * batch.num_rows,
            ),
            r"returned a sequence_number column of type string",
        ),
        (
            lambda batch: (
                pa.table({"sequence_number": pc.add(batch.column(0), 1000), "n": batch.column(0)}),
                [None] * batch.num_rows,
            ),
            r"returned 10 row\(s\) whose sequence_number is no message of the batch",
        ),
        (lambda batch: [{"n": 1}], "returned its rows as list"),
    ],
)
def test_rows_that_cannot_be_tied_to_their_messages_stop_the_run(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path, function: Any, problem: str
) -> None:
    """Rows returned with errors must say whose they are, by a ``sequence_number`` of the
    batch (not by their place, which a sort or a join changes): rows that cannot be tied
    back, or rows of another type, stop the run as the function's defect with the lease
    given back and nothing settled."""
    send(live, {3: {"kind": "refused"}, 7: {"kind": "refused"}}, 10)
    run = Pipeline(
        spark, url=url, queue="orders", map_batches=function, schema="n long",
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match=problem):
        run.run()
    assert live.counts("orders")["active"] == 10 and dead_letters_by_id(live) == {}
    assert_balanced(live)


def test_a_run_stopped_at_its_first_batch_leaves_an_output_spark_can_read(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A batch the run stops at is written as nothing, so the output directory of a run
    stopped before any batch was written is read as no rows of the schema, not refused
    for want of a schema."""
    send(live, {}, 12)
    out = tmp_path / "out"
    run = Pipeline(
        spark, url=url, queue="orders", map_batches=errors_of_length(1), schema="n long",
        output=str(out),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError):
        run.run()
    frame = spark.read.parquet(str(out))
    assert frame.count() == 0 and "n" in frame.columns
    assert_balanced(live)


def test_a_cast_error_a_batch_function_raises_is_retried_unless_permanent_names_it(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A raised ``pyarrow.ArrowInvalid`` is no ``PermanentError``: the message that raises it
    alone is retried by the queue's policy until its deliveries run out (with
    ``permanent=(pa.ArrowInvalid,)`` it is dead-lettered at once, as the test above shows)."""
    send(live, {5: {"qty": "many"}}, 20, max_delivery_count=2)
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=quantities, schema="n long, qty long",
        output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.dead_lettered == {"MaxDeliveryCountExceeded": 1} and report.retried == 1
    [dead] = dead_letters_by_id(live).values()
    assert [f.error_type for f in dead.failures] == ["pyarrow.lib.ArrowInvalid"] * 2
    assert written(spark, tmp_path / "out") == Counter(set(range(20)) - {5})
    assert_balanced(live)


def test_an_empty_text_for_an_error_stops_the_run_naming_the_message_and_its_row(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """An error entry is ``None`` for a good message and a text is the reason of a
    rejection: an empty text is neither, so a function returning ``""`` for its good
    messages (pandas' habit) is stopped as its defect at its first batch, naming the message
    and its row, before anything is dead-lettered or a delivery counted."""
    send(live, {}, 8)
    [first] = [m.sequence_number for m in live.peek("orders", max_messages=1)]
    run = Pipeline(
        spark, url=url, queue="orders", map_batches=blank_for_good, schema=SCHEMA,
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError) as stopped:
        run.run()
    assert f"returned an empty text as the error of message {first} (row 0 of" in str(stopped.value)
    assert stopped.value.report.dead_lettered == {} and dead_letters_by_id(live) == {}
    assert {m.delivery_count for m in live.peek("orders", max_messages=8)} == {0}
    assert_balanced(live)


@pytest.mark.parametrize("tie", [False, True])
def test_untied_rows_fewer_than_messages_complete_the_rest_as_filtered_with_a_warning(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path, tie: bool
) -> None:
    """Rows returned alone that are fewer than the messages leave the rest completed as
    filtered; the executor warns once per batch how many had no row, unless the rows are
    tied by ``sequence_number`` (filtering on purpose: no warning)."""
    send(live, {n: {"kind": "dropped"} for n in (2, 5, 11)}, 16)
    log_file = tmp_path / "executor.log"
    report = Pipeline(
        spark, url=url, queue="orders", map_batches=kept_orders(log_file, tie),
        schema="n long", output=str(tmp_path / "out"),
    ).run()  # fmt: skip
    assert report.completed == 16 and report.dead_lettered == {}
    assert written(spark, tmp_path / "out") == Counter(set(range(16)) - {2, 5, 11})
    warnings = log_file.read_text().splitlines() if log_file.exists() else []
    if tie:
        assert warnings == []
    else:
        [warning] = warnings
        assert warning.startswith("map_batches function kept_orders.<locals>.kept returned")
        assert "3 of this batch's 16 message(s) (at least) had no row" in warning
    assert_balanced(live)


def unchanged(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch function that returns the messages it was given: no row fits the schema."""
    return batch


def test_a_batch_function_whose_rows_never_fit_stops_its_task_after_the_first_hundred_messages(
    spark: SparkSession, live: Broker, url: str, tmp_path: Path
) -> None:
    """A defect is judged after a partition's first 100 messages, not after a chunk of
    10,000 of them, each run under the crash guard and each failure recorded: a function
    returning its input batch unchanged stops the run at once, nothing settled."""
    send(live, {}, 1000)
    run = Pipeline(
        spark, url=url, queue="orders", map_batches=unchanged, schema="n long",
        output=str(tmp_path / "out"),
    )  # fmt: skip
    with pytest.raises(PipelineStoppedError, match="100 of 100 messages failed") as stopped:
        run.run()
    assert stopped.value.defect is not None
    assert "the rows have no column(s) n" in stopped.value.defect.failure.message
    assert live.counts("orders")["active"] == 1000
    assert {m.delivery_count for m in live.peek("orders", max_messages=1000)} == {0}
    assert_balanced(live)
