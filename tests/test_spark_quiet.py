"""The runner's jobs are quiet in any session, not only in ``local_session()``'s: a row that
fails its job costs a line of the runner's, not the JVM's stacks of every failed task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import poisonq
from poisonq.spark import foreach_batch
from tests.helpers import assert_balanced, fill_orders, start_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# A user's own session (Spark's default logging, WARN), a cast error in one row of 40.
USERS_SESSION = """
import sys
from pyspark.sql import SparkSession, functions as F
from poisonq.spark import Pipeline

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())


def orders(batch):
    n = F.get_json_object(F.col("body").cast("string"), "$.n").cast("int")
    return batch.select("sequence_number", n.alias("n"))


report = Pipeline(spark, url=sys.argv[1], queue="orders", transform=orders,
                  output=sys.argv[2]).run()
print("isolation jobs", report.isolation_jobs, file=sys.stderr)
"""


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=1)
        bodies = [b'{"n": "x"}' if n == 13 else f'{{"n": {n}}}'.encode() for n in range(40)]
        broker.sender("orders").send([poisonq.Message(body=body) for body in bodies])
    script = tmp_path / "job.py"
    script.write_text(USERS_SESSION)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, str(script), url, str(tmp_path / "out"), *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_failing_row_prints_one_line_and_no_stack_in_a_users_own_session(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    frames = [line for line in lines if line.lstrip().startswith(("at ", 'File "'))]
    assert frames == []
    assert not any("ERROR Executor" in line or "TaskSetManager" in line for line in lines)
    assert not any("replaced a statically registered data source" in line for line in lines)
    assert int(lines[-1].split()[-1]) > 0  # the row did fail its jobs
    [isolated] = [line for line in lines if "failed alone" in line]
    assert isolated.startswith(
        "batch 1: message 14 failed alone: dead-lettered CAST_INVALID_INPUT:"
    )
    assert "The value 'x'" in isolated


CAST = """
from pyspark.sql import functions as F


def orders(batch):
    n = F.get_json_object(F.col("body").cast("string"), "$.n").cast("int")
    return batch.select("sequence_number", n.alias("n"))
"""


def test_pipeline_run_verbose_logs_the_failed_tasks_as_spark_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=1)
        bodies = [b'{"n": "x"}' if n == 3 else f'{{"n": {n}}}'.encode() for n in range(6)]
        broker.sender("orders").send([poisonq.Message(body=body) for body in bodies])
    (tmp_path / "jobs.py").write_text(CAST)
    poisonq_cli = Path(sys.executable).with_name("poisonq")
    done = subprocess.run(
        [str(poisonq_cli), "--url", url, "pipeline", "run", "jobs.py:orders",
         "--queue", "orders", "--output", "out", "--quiet", "--verbose"],
        cwd=tmp_path, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert any("ERROR Executor" in line for line in lines)
    assert any(line.lstrip().startswith("at org.apache.spark") for line in lines)
    assert any(line.startswith("batch 1: message 4 failed alone") for line in lines)


def test_foreach_batch_logs_one_line_per_message_found_failing_alone(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders", max_delivery_count=1, lock_duration=30)
        sent = fill_orders(broker, 8)
        poison = sent[3]

        def handle(df: DataFrame, batch_id: int) -> None:
            got = [r.sequence_number for r in df.select("sequence_number").collect()]
            if poison in got:
                raise RuntimeError(f"cannot write message {poison}")

        query = start_stream(spark, url, tmp_path / "ck", foreach_batch(handle), "fb")
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        isolated = [r.getMessage() for r in caplog.records if "failed alone" in r.getMessage()]
        [line] = isolated
        assert line.startswith(f"batch 0: message {poison} failed alone: RuntimeError: cannot")
        assert "\n" not in line
        assert_balanced(broker)


# A job whose second task fails while the first one's Python worker is still writing rows:
# Spark cancels the first, and its worker meets a closed socket.
CANCELLED_WORKER = """
import sys, time
from poisonq.spark import local_session

spark = local_session("quiet")
if len(sys.argv) > 1:  # PySpark's own daemon, for comparison
    spark.stop()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.daemon.module", "pyspark.daemon").getOrCreate())


def rows(batches):
    for batch in batches:
        if batch.column(0)[0].as_py() >= 1_000_000:
            time.sleep(1)
            raise ValueError("the second task fails")
        for _ in range(200):
            time.sleep(0.01)
            yield batch


frame = spark.range(0, 2_000_000, numPartitions=2).mapInArrow(rows, "id long")
try:
    frame.write.format("noop").mode("overwrite").save()
except Exception:
    print("the job failed", file=sys.stderr)
"""


def test_a_worker_whose_task_spark_cancelled_prints_no_stack_in_local_session(
    tmp_path: Path,
) -> None:
    """When a job fails, Spark cancels its other tasks; their Python workers end quietly
    (PySpark's daemon prints a BrokenPipeError stack for each)."""
    script = tmp_path / "job.py"
    script.write_text(CANCELLED_WORKER)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the job failed" in done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert "Traceback" not in done.stderr


def test_an_interrupt_is_not_replaced_by_a_broken_connection_as_the_loggers_are_put_back() -> None:
    """A Ctrl-C that lands in a call to the JVM can leave py4j's connection broken, so that
    putting the task failure loggers back fails as well: the interrupt still propagates (the
    runner prints its report and exits 130), not the connection's error."""
    from py4j.protocol import Py4JNetworkError

    from poisonq.spark import session

    def broken() -> None:
        raise Py4JNetworkError("Answer from Java side is empty")

    with pytest.raises(KeyboardInterrupt), session.quiet_query_errors():
        session._quieted.append(broken)
        raise KeyboardInterrupt
    assert session._quieted == []
