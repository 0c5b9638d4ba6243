"""The Spark runtime from a Spark Connect client (``SparkSession.builder.remote``), against a
Connect server started from the PySpark installation (``poisonq.testing.sparkcluster``).
The server's Python workers find the ``pyspark_poisonq`` data source on their path, so the
client uses ``format("poisonq")`` without registering anything. Each job of
``tests/spark_jobs.py`` runs in a client process of its own, over a PostgreSQL queue, and
ends with the chaos suite's end-state check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from poisonq.testing.sparkcluster import ConnectServer
from tests.chaos.scenarios import output_ids
from tests.helpers import Orders
from tests.spark_jobs import PROGRAM, ROOT, TIMEOUT, environment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server() -> Iterator[ConnectServer]:
    """One server for the module; its Python workers find the checkout on their path, as
    an install of poisonq next to the server would put it there."""
    with ConnectServer(python_path=[str(ROOT)]) as started:
        yield started.start()


def run(server: ConnectServer, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a job of ``tests/spark_jobs.py`` as a Connect client of ``server``."""
    command = [sys.executable, str(PROGRAM), args[0], server.url]
    return subprocess.run(
        [*command, *args[1:]], cwd=work, env=environment(), capture_output=True, text=True,
        timeout=TIMEOUT, check=False,
    )  # fmt: skip


def succeeds(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-5000:]


def test_the_data_source_reads_a_queue_over_connect(
    server: ConnectServer, orders: Orders, tmp_path: Path
) -> None:
    succeeds(run(server, tmp_path, "read", orders.url, str(tmp_path / "out")))
    assert sorted(output_ids(tmp_path / "out")) == sorted(orders.good | orders.bad.keys())
    assert orders.broker.counts("orders")["active"] == orders.count


def test_the_pipeline_runner_with_map_over_connect(
    server: ConnectServer, orders: Orders, tmp_path: Path
) -> None:
    """The runner registers its per-pipeline data source over Connect too."""
    succeeds(run(server, tmp_path, "map", orders.url, str(tmp_path / "out")))
    assert orders.problems(output_ids(tmp_path / "out")) == "none"


def test_a_readstream_query_with_foreach_batch_over_connect(
    server: ConnectServer, orders: Orders, tmp_path: Path
) -> None:
    """The server runs the ``foreach_batch`` function (with its expectation) in a Python
    process of its own, with a Connect session of its own."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    succeeds(run(server, tmp_path, "stream", orders.url, str(out), str(checkpoint)))
    assert orders.problems(output_ids(out), "ExpectationFailed") == "none"


def test_the_pipeline_runner_with_a_transform_says_it_needs_a_classic_session(
    server: ConnectServer, orders: Orders, tmp_path: Path
) -> None:
    """The runner refuses a Connect session for transform= before any lease is taken: the
    queue is untouched."""
    done = run(server, tmp_path, "transform", orders.url, str(tmp_path / "out"))
    assert done.returncode != 0
    assert (
        "poisonq.errors.InvalidOperationError: the pipeline runner's transform= needs the"
        " SparkContext"
    ) in done.stderr
    assert "use map=" in done.stderr
    assert orders.broker.counts("orders")["active"] == orders.count
