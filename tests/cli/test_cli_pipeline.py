"""``poisonq pipeline run`` on the real local Spark session of the test run.

The queue lives in a real SQLite file and is used with the real clock: Spark's executors
open the store themselves and know no other. The transform is a file written to the test's
directory, as a user's would be, so it also proves that a transform Spark cannot import by
name reaches the executors.
"""

from __future__ import annotations

import _thread
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

from poisonq import Broker, Message
from poisonq.cli import cli
from tests.cli.conftest import DLQ, assert_one_error_line, run, run_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TRANSFORM = '''
import json
import subprocess
import sys

from poisonq import PermanentError


class BadOrder(PermanentError):
    """An order that can never be booked: dead-letter it at once."""


def transform(message):
    n = json.loads(message["body"])["n"]
    if n % 10 == 3:
        raise BadOrder(f"order {n} is bad")
    if n % 10 == 7:
        raise KeyError(f"cust-{n}")  # a lookup that keeps failing: retried, then poisoned
    if n % 10 == 9:
        return None  # filtered out: completed without an output row
    return {"n": n}


def batch(messages):
    """The same outcomes as a function of a batch: the errors it returns, one a message, and
    a row for each message but the 9s, tied to it by its sequence_number."""
    import pyarrow as pa

    rows, errors = [], []
    seqs = messages.column("sequence_number").to_pylist()
    for seq, body in zip(seqs, messages.column("body").to_pylist()):
        n = json.loads(body)["n"]
        errors.append(
            BadOrder(f"order {n} is bad") if n % 10 == 3
            else KeyError(f"cust-{n}") if n % 10 == 7
            else None
        )
        if n % 10 != 9:
            rows.append({"sequence_number": seq, "n": n})
    schema = pa.schema([("sequence_number", pa.int64()), ("n", pa.int64())])
    return pa.Table.from_pylist(rows, schema=schema), errors
'''
GOOD = [n for n in range(50) if n % 10 not in (3, 7, 9)]

# The same outcomes from a DataFrame transform: 3s fail an expectation, 7s fail in a poisonq
# UDF (retried, then poisoned), 9s are filtered out.
FRAME_TRANSFORM = """
from pyspark.sql import functions as F

from poisonq.spark import udf


def find_customer(n):
    if n % 10 == 7:
        raise KeyError(f"cust-{n}")
    return f"cust-{n}"


customer = udf(find_customer, "string")


def transform(batch):
    order = F.from_json(F.col("body").cast("string"), "n long")
    orders = batch.select("sequence_number", order.alias("o")).select("sequence_number", "o.n")
    return orders.where(F.col("n") % 10 != 9).withColumn("customer", customer("n"))


def no_sequence_number(batch):
    return batch.select("message_id")
"""


@pytest.fixture
def transform(tmp_path: Path) -> str:
    path = tmp_path / "jobs" / "transform.py"
    path.parent.mkdir()
    path.write_text(TRANSFORM)
    return f"{path}:transform"


@pytest.fixture
def frame_transform(tmp_path: Path) -> str:
    path = tmp_path / "frames.py"
    path.write_text(FRAME_TRANSFORM)
    return f"{path}:transform"


@pytest.fixture
def fifty(api: Broker, orders: str) -> str:
    """50 orders ``{"n": 0..49}`` in ``orders`` (two deliveries before poisoning)."""
    bodies = [Message(body=json.dumps({"n": n}), message_id=f"o-{n}") for n in range(50)]
    api.sender(orders).send(bodies)
    return orders


def pipeline(url: str, target: str, output: Path, *args: str, code: int = 0) -> Any:
    """``pipeline run TARGET`` over ``orders`` with ``--json``, per row (``--schema``); the
    report it printed."""
    return frames(url, target, output, "--schema", "n long", *args, code=code)


def frames(url: str, target: str, output: Path, *args: str, code: int = 0) -> Any:
    """``pipeline run TARGET`` over ``orders`` with ``--json``, a DataFrame transform unless
    ``args`` hold ``--schema``; the report it printed."""
    result = run(
        url,
        *("pipeline", "run", target, "--queue", "orders"),
        *("--output", str(output), "--json", *args),
        code=code,
    )
    return json.loads(result.stdout) if code == 0 else result


def test_pipeline_run_writes_good_rows_and_dead_letters_the_rest(
    spark: SparkSession, url: str, api: Broker, fifty: str, transform: str, tmp_path: Path
) -> None:
    report = pipeline(url, transform, tmp_path / "out", "--batch-size", "25")
    # Abandoned messages return at the front of the queue and come again in a later lease
    # (which one depends on whether it was taken before they failed: leases are taken
    # ahead, while the batch before runs).
    assert report["leased"] == 55
    assert (report["completed"], report["retried"]) == (40, 5)
    assert report["dead_lettered"] == {"BadOrder": 5, "MaxDeliveryCountExceeded": 5}
    assert report["interrupted"] is False

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(row.n for row in rows) == GOOD
    assert {row.consumer for row in rows} == {"pipeline"}
    assert {row.lease for row in rows} <= set(range(1, report["batches"] + 1))

    dead = {m.message_id: m for m in api.peek(DLQ, max_messages=100)}
    assert {i: m.dead_letter_reason for i, m in dead.items()} == {
        **{f"o-{n}": "BadOrder" for n in range(3, 50, 10)},
        **{f"o-{n}": "MaxDeliveryCountExceeded" for n in range(7, 50, 10)},
    }
    assert "order 13 is bad" in (dead["o-13"].dead_letter_error_description or "")
    assert dead["o-17"].dead_letter_error_description == "KeyError: 'cust-17'"
    assert [f.error_type for f in dead["o-17"].failures] == ["KeyError", "KeyError"]
    assert api.counts(fifty)["completed"] == 40
    assert api.audit().ok


def test_a_batch_function_runs_with_batches_and_settles_what_it_returns(
    spark: SparkSession, url: str, api: Broker, fifty: str, transform: str, tmp_path: Path
) -> None:
    """With --schema and --batches FUNC takes an Arrow batch of messages: the errors it
    returns settle their messages as a per-row function's exceptions would."""
    target = transform.replace(":transform", ":batch")
    report = pipeline(url, target, tmp_path / "out", "--batches", "--batch-size", "25")
    assert report["completed"] == 40
    assert report["dead_lettered"] == {"BadOrder": 5, "MaxDeliveryCountExceeded": 5}
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(row.n for row in rows) == GOOD
    assert api.audit().ok


def test_a_batch_function_run_without_batches_is_one_error_line_before_spark_starts(
    url: str, api: Broker, fifty: str, transform: str, tmp_path: Path
) -> None:
    """A function given --schema is tried on an empty Arrow batch of messages before Spark
    starts: one that returns rows is a function of a batch, which needs --batches (run per
    message, it would fail on every one). Nothing is leased, nothing written."""
    target = transform.replace(":transform", ":batch")
    result = pipeline(url, target, tmp_path / "out", code=2)
    assert_one_error_line(result, f"{target} is a function of a batch", "run it with --batches")
    assert not (tmp_path / "out").exists()
    assert api.counts(fifty)["active"] == 50
    assert {m.delivery_count for m in api.peek(fifty, max_messages=50)} == {0}


@pytest.mark.spark  # (its run starts a SparkSession: asks for no fixture that says so)
def test_a_function_that_kills_its_process_on_a_batch_is_tried_apart_from_the_command(
    url: str, api: Broker, fifty: str, tmp_path: Path
) -> None:
    """The empty batch a function given --schema is tried on before Spark starts may kill
    its process (a function of one message given a batch, a native library): it is tried
    under the crash guard, so the command goes on and the run handles each message's crash
    as it does any crash (here every message: a defect, the run stops, nothing spent)."""
    path = tmp_path / "dies.py"
    path.write_text("import os\n\ndef dies(message):\n    os._exit(7)\n")
    result = pipeline(url, f"{path}:dies", tmp_path / "out", code=2)
    assert "50 of 50 messages failed the same way (WorkerCrashed" in result.stderr
    assert api.counts(fifty)["active"] == 50
    assert {m.delivery_count for m in api.peek(fifty, max_messages=50)} == {0}


def test_pipeline_run_shows_progress_and_a_table(
    spark: SparkSession, url: str, api: Broker, orders: str, transform: str, tmp_path: Path
) -> None:
    api.sender(orders).send([Message(body=json.dumps({"n": n})) for n in (0, 1, 3)])
    terminal = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "0", "COLUMNS": "200"}
    args = ["pipeline", "run", "--queue", orders, "--schema", "n long", transform]
    result = CliRunner().invoke(
        cli, ["--url", url, *args, "--output", str(tmp_path / "out")], env=terminal
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert "pipeline orders" in result.stderr
    assert "1 batch(es) · 3 leased · 2 completed · 0 retried · " in result.stderr
    table = result.stdout
    assert "pipeline orders → " in table and "BadOrder" in table
    assert [line.split() for line in table.splitlines() if "completed" in line] == [
        ["completed", "2"]
    ]
    [batch] = run_json(url, "pipeline", "show", "pipeline")
    assert (batch["size"], batch["completed"], batch["dead_lettered"]) == (3, 2, {"BadOrder": 1})

    api.sender(orders).send([Message(body=json.dumps({"n": 4}))])
    quiet = CliRunner().invoke(
        cli, ["--url", url, *args, "--output", str(tmp_path / "out"), "--quiet"], env=terminal
    )
    assert quiet.exit_code == 0, (quiet.stderr, quiet.exception)
    assert quiet.stderr == "" and "pipeline orders → " in quiet.stdout


def test_pipeline_run_forever_stops_on_ctrl_c_with_the_report(
    spark: SparkSession, url: str, api: Broker, fifty: str, transform: str, tmp_path: Path
) -> None:
    """--forever keeps waiting on a drained queue; Ctrl-C prints the report so far and exits
    0, as stopping is the normal end of a run that never ends."""
    output = tmp_path / "out"

    def interrupt_when_drained() -> None:
        # Lease 2 (the five retries) is the last; once its output is committed the runner
        # is settling or idle, not inside a Spark job of the shared session.
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and not (output / "consumer=pipeline" / "lease=2" / "_SUCCESS").exists()
        ):
            time.sleep(0.1)
        _thread.interrupt_main()

    watcher = threading.Thread(target=interrupt_when_drained, daemon=True)
    watcher.start()
    report = pipeline(url, transform, output, "--forever")
    watcher.join()
    assert report["interrupted"] is True
    assert (report["batches"], report["leased"]) == (2, 55)
    counts = api.counts(fifty)
    assert (counts["completed"], counts["dead_lettered"], counts["active"]) == (40, 10, 0)


# poisonq.spark.udf declares its Arrow UDF by type, which PySpark warns about on each call.
def test_a_dataframe_transform_runs_with_expectations_and_poisonq_udfs(
    spark: SparkSession,
    url: str,
    api: Broker,
    fifty: str,
    frame_transform: str,
    tmp_path: Path,
) -> None:
    """Without --schema FUNC is a DataFrame transform: a row failing an --expect dead-letters
    its message, a poisonq UDF that raises fails only its row's message (retried, then
    poisoned), a message without rows is completed; rows keep their sequence_number."""
    output = tmp_path / "out"
    report = frames(url, frame_transform, output, "--expect", "not_three=n % 10 != 3")
    # Lease 2 holds the five abandoned 7s again, which fail their second delivery.
    assert (report["batches"], report["leased"]) == (2, 55)
    assert (report["completed"], report["retried"]) == (40, 5)
    assert report["dead_lettered"] == {"ExpectationFailed": 5, "MaxDeliveryCountExceeded": 5}

    rows = spark.read.parquet(str(output)).collect()
    assert sorted(row.n for row in rows) == GOOD
    assert {row.customer for row in rows} == {f"cust-{n}" for n in GOOD}
    assert {(row.consumer, row.lease) for row in rows} == {("pipeline", 1)}

    dead = {m.message_id: m for m in api.peek(DLQ, max_messages=100)}
    assert {i: m.dead_letter_reason for i, m in dead.items()} == {
        **{f"o-{n}": "ExpectationFailed" for n in range(3, 50, 10)},
        **{f"o-{n}": "MaxDeliveryCountExceeded" for n in range(7, 50, 10)},
    }
    assert "not_three" in (dead["o-13"].dead_letter_error_description or "")
    assert [f.error_type for f in dead["o-17"].failures] == ["KeyError", "KeyError"]
    assert "find_customer" in (dead["o-17"].failures[0].traceback or "")
    # Each row was written with the sequence number of the message it comes from (sent in
    # order of n, as the dead-lettered ones show).
    offset = dead["o-3"].sequence_number - 3
    assert {row.sequence_number - row.n for row in rows} == {offset}
    assert api.counts(fifty)["completed"] == 40
    assert api.audit().ok


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("transform.py", "expected MODULE:FUNC"),
        ("no_such_module_zz:f", "cannot import 'no_such_module_zz'"),
        ("json:no_such_function", "has no attribute 'no_such_function'"),
        ("json:__doc__", "is not a function but str"),
        ("nowhere/transform.py:transform", "no such file"),
    ],
)
def test_a_bad_target_is_one_error_line(
    url: str, orders: str, tmp_path: Path, target: str, fragment: str
) -> None:
    result = pipeline(url, target, tmp_path / "out", code=2)
    assert_one_error_line(result, fragment)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ("--schema", "n long", "--expect", "ok=n > 0"),
            ("--expect checks the rows of a Data", "raise PermanentError for a message it rej"),
        ),
        (
            ("--schema", "n long", "--batches", "--expect", "ok=n > 0"),
            ("the rows of a batch function (--batches) are checked against --schema", "Rejected"),
        ),
        (("--expect", "n >= 0"), ("--expect expects NAME=SQL", "not 'n >= 0'")),
        (("--expect", "ok="), ("--expect expects NAME=SQL",)),
        (("--expect", "ok=n > 0", "--expect", "ok=n < 9"), ("--expect 'ok' is given twice",)),
        (("--ignore-extra-fields",), ("--ignore-extra-fields goes with --schema",)),
        (("--no-isolate",), ("--isolate/--no-isolate goes with --schema",)),
        (("--batches",), ("--batches goes with --schema",)),
    ],
)
def test_options_of_the_other_kind_are_one_error_line(
    url: str, orders: str, frame_transform: str, tmp_path: Path, args: Any, fragments: Any
) -> None:
    """Caught before Spark starts; expectations given to a function of messages are refused
    with how that kind rejects a message instead."""
    result = frames(url, frame_transform, tmp_path / "out", *args, code=2)
    assert_one_error_line(result, *fragments)


def test_a_function_run_as_the_other_kind_is_one_error_line(
    spark: SparkSession,
    url: str,
    api: Broker,
    fifty: str,
    transform: str,
    frame_transform: str,
    tmp_path: Path,
) -> None:
    """Each kind is tried on an empty batch first: nothing is leased, nothing written."""
    output = tmp_path / "out"
    per_row = frames(url, transform, output, code=2)
    assert_one_error_line(
        per_row,
        f"{transform} is not a DataFrame transform",
        "it raised TypeError(",
        "a function of one message (a dict) runs with --schema DDL",
    )
    frame = pipeline(url, frame_transform, output, code=2)
    assert_one_error_line(frame, f"{frame_transform} is a DataFrame transform", "drop --schema")
    path = frame_transform.rpartition(":")[0]
    unkept = frames(url, f"{path}:no_sequence_number", output, code=2)
    assert_one_error_line(unkept, "must keep the sequence_number", "it has message_id")
    for expect, fragment in (
        ("ok=amount > 0", "expectation 'ok' (amount > 0) does not apply: "),
        ("ok=n + 1", "expectation 'ok' (n + 1) is a bigint, not a boolean"),
    ):
        bad = frames(url, frame_transform, output, "--expect", expect, code=2)
        assert_one_error_line(bad, fragment)
    assert not output.exists()
    counts = api.counts(fifty)
    assert (counts["active"], counts["locked"], counts["dead_lettered"]) == (50, 0, 0)
    assert {m.delivery_count for m in api.peek(fifty, max_messages=50)} == {0}


def test_a_missing_function_in_a_file_is_one_error_line(
    url: str, orders: str, transform: str, tmp_path: Path
) -> None:
    path = transform.rpartition(":")[0]
    result = pipeline(url, f"{path}:transfrom", tmp_path / "out", code=2)
    assert_one_error_line(result, "has no attribute 'transfrom'")


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        ("def orders(b)\n    return b\n", ("does not compile: expected ':'", "line 1)")),
        ("import json\nVALUE = 1 / 0\n", ("raised ZeroDivisionError: division by zero", "line 2)")),
    ],
)
def test_a_transform_file_that_fails_to_import_is_one_error_line(
    url: str, orders: str, tmp_path: Path, source: str, fragments: tuple[str, ...]
) -> None:
    """A transform file that fails to import (a syntax error, an error raised at import) is
    one error line naming the file and the line, exit code 2."""
    path = tmp_path / "jobs.py"
    path.write_text(source)
    result = pipeline(url, f"{path}:orders", tmp_path / "out", code=2)
    assert_one_error_line(result, *fragments)


def test_an_unknown_queue_or_a_bad_schema_is_one_error_line(
    spark: SparkSession, url: str, orders: str, transform: str, tmp_path: Path
) -> None:
    args = ("pipeline", "run", transform, "--output", str(tmp_path / "out"))
    unknown = run(url, *args, "--queue", "nope", "--schema", "n long", code=2)
    assert_one_error_line(unknown, "no queue 'nope'")
    for schema, fragment in (("n lung", "is not Spark DDL"), ("bigint", "must list columns")):
        bad = run(url, *args, "--queue", orders, "--schema", schema, code=2)
        assert_one_error_line(bad, f"--schema '{schema}'", fragment)


def test_a_pipeline_whose_sink_fails_stops_with_one_error_line(
    spark: SparkSession, url: str, api: Broker, orders: str, transform: str, tmp_path: Path
) -> None:
    """A sink that cannot be written fails every batch as a whole, whatever its messages:
    the run stops at once; the messages are given back, not blamed."""
    api.sender(orders).send([Message(body=json.dumps({"n": n})) for n in range(5)])
    result = pipeline(url, transform, tmp_path / "out", "--format", "no-such-format", code=2)
    assert result.stdout == ""
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: stopped at lease 1: 5 of 5 messages failed the same way")
    assert "BatchJobFailed" in last and "without a delivery counted" in last
    counts = api.counts(orders)
    assert (counts["active"], counts["dead_lettered"], counts["completed"]) == (5, 0, 0)


def test_a_bug_in_the_transform_stops_with_its_traceback_printed_once(
    spark: SparkSession, url: str, api: Broker, fifty: str, tmp_path: Path
) -> None:
    """A bug in the transform stops the run and prints its traceback once; no message is
    retried or dead-lettered for it."""
    path = tmp_path / "buggy.py"
    path.write_text("def transform(message):\n    return {'n': totl}\n")
    result = pipeline(url, f"{path}:transform", tmp_path / "out", code=2)
    assert result.stdout == ""
    assert result.stderr.count("NameError: name 'totl' is not defined") == 2  # trace, line
    assert result.stderr.count("Traceback (most recent call last)") == 1
    assert "return {'n': totl}" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: stopped at lease 1: 50 of 50")
    counts = api.counts(fifty)
    assert (counts["active"], counts["dead_lettered"]) == (50, 0)
    assert {m.delivery_count for m in api.peek(fifty, max_messages=50)} == {0}


def test_permanent_exception_types_dead_letter_at_once(
    spark: SparkSession, url: str, api: Broker, fifty: str, transform: str, tmp_path: Path
) -> None:
    path = transform.rpartition(":")[0]
    report = pipeline(
        url, transform, tmp_path / "out", "--permanent", "KeyError",
        "--permanent", f"{path}:BadOrder",
    )  # fmt: skip
    assert report["dead_lettered"] == {"BadOrder": 5, "KeyError": 5}
    assert (report["completed"], report["retried"]) == (40, 0)
    for bad, fragment in (
        ("nope.Missing", "cannot import 'nope'"),
        ("json.dumps", "is not an exception class"),
        ("json.Nope", "has no attribute 'Nope'"),
    ):
        result = pipeline(url, transform, tmp_path / "out", "--permanent", bad, code=2)
        assert_one_error_line(result, fragment)


def test_only_spark_commands_need_pyspark(
    url: str, orders: str, transform: str, tmp_path: Path
) -> None:
    """With PySpark unimportable, the other commands (the engine demo too) work, and the
    Spark ones say what to install in one line."""
    blocked = "import sys; sys.modules['pyspark'] = None; from poisonq.cli import main; main()"
    command = [sys.executable, "-c", blocked, "--url", url]

    def poisonq_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)

    listed = poisonq_("queue", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [q["name"] for q in json.loads(listed.stdout)] == [orders]
    engine = poisonq_("demo", "--engine", "--orders", "200", "--dir", str(tmp_path / "demo"))
    assert engine.returncode == 0 and "✗" not in engine.stdout, engine.stderr
    needs = "error: this command needs PySpark: pip install 'poisonq[spark]'"
    for args in (
        ("pipeline", "run", transform, "--queue", orders, "--schema", "n long", "--output", "o"),
        ("demo", "--dir", str(tmp_path / "demo")),
    ):
        refused = poisonq_(*args)
        assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (2, "", [needs])


MODULE_LEVEL_UDFS = """
from pyspark.sql import functions as F

from poisonq.spark import udf

doubled = F.udf(lambda n: n * 2, "long")  # PySpark parses "long" with a session only
named = udf(lambda n: f"n{n}", "string")


def transform(batch):
    n = F.get_json_object(F.col("body").cast("string"), "$.n").cast("long")
    return batch.select("sequence_number", doubled(n).alias("twice"), named(n).alias("name"))
"""


@pytest.mark.spark
def test_a_job_file_that_builds_udfs_when_imported_runs(
    url: str, api: Broker, fifty: str, tmp_path: Path
) -> None:
    """A module-level UDF with a DDL type needs a SparkSession when the file is imported,
    before the command line has started one: it starts one and imports again. Run in a
    process of its own, which has no session yet."""
    job = tmp_path / "udfs.py"
    job.write_text(MODULE_LEVEL_UDFS)
    out = tmp_path / "out"
    command = (
        "import sys; from poisonq.cli import main; sys.argv = ['poisonq'] + sys.argv[1:]; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", command, "--url", url, "pipeline", "run", f"{job}:transform",
         "--queue", fifty, "--output", str(out), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["completed"] == 50
