"""The Spark runtime from a Spark Connect client (``SparkSession.builder.remote``), against a
Connect server started from the PySpark installation (``poisonq.testing.sparkcluster``).
The server's Python workers find the ``pyspark_poisonq`` data source on their path, so the
client uses ``format("poisonq")`` without registering anything. Each job of
``tests/spark_jobs.py`` runs in a client process of its own, over a PostgreSQL queue, and
ends with the chaos suite's end-state check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import poisonq
from poisonq.testing.sparkcluster import ConnectServer
from tests.chaos.scenarios import output_ids, send_orders
from tests.chaos.verdict import check

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT = 300
ORDERS = 1000

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server() -> Iterator[ConnectServer]:
    """One server for the module; its Python workers find the checkout on their path, as
    an install of poisonq next to the server would put it there."""
    with ConnectServer(python_path=[str(ROOT)]) as started:
        yield started.start()


def run(server: ConnectServer, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a job of ``tests/spark_jobs.py`` as a Connect client of ``server``."""
    command = [sys.executable, str(ROOT / "tests" / "spark_jobs.py"), args[0], server.url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*command, *args[1:]], cwd=work, env=env, capture_output=True, text=True,
        timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip


def succeeds(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-5000:]


@pytest.fixture
def orders(pg_url: str) -> Iterator[tuple[poisonq.Broker, set[str], dict[str, str]]]:
    """A PostgreSQL queue of orders, about 1 % of them bad."""
    with poisonq.connect(pg_url) as broker:
        broker.create_queue("orders", max_delivery_count=3)
        good, bad = send_orders(broker, "orders", ORDERS)
        yield broker, good, bad


def test_the_data_source_reads_a_queue_over_connect(
    server: ConnectServer, orders: tuple[poisonq.Broker, set[str], dict[str, str]],
    pg_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    broker, good, bad = orders
    succeeds(run(server, tmp_path, "read", pg_url, str(tmp_path / "out")))
    assert sorted(output_ids(tmp_path / "out")) == sorted(good | bad.keys())
    assert broker.counts("orders")["active"] == ORDERS


def test_the_pipeline_runner_with_map_over_connect(
    server: ConnectServer, orders: tuple[poisonq.Broker, set[str], dict[str, str]],
    pg_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The runner registers its per-pipeline data source over Connect too."""
    broker, good, bad = orders
    succeeds(run(server, tmp_path, "map", pg_url, str(tmp_path / "out")))
    verdict = check(broker, "orders", good, bad, output_ids(tmp_path / "out"))
    assert verdict.ok, verdict.problems()


def test_a_readstream_query_with_foreach_batch_over_connect(
    server: ConnectServer, orders: tuple[poisonq.Broker, set[str], dict[str, str]],
    pg_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The server runs the ``foreach_batch`` function (with its expectation) in a Python
    process of its own, with a Connect session of its own."""
    broker, good, bad = orders
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    succeeds(run(server, tmp_path, "stream", pg_url, str(out), str(checkpoint)))
    verdict = check(
        broker, "orders", good, dict.fromkeys(bad, "ExpectationFailed"), output_ids(out)
    )
    assert verdict.ok, verdict.problems()


def test_the_pipeline_runner_with_a_transform_says_it_needs_a_classic_session(
    server: ConnectServer, orders: tuple[poisonq.Broker, set[str], dict[str, str]],
    pg_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """Before any lease is taken: the queue is untouched."""
    broker, _, _ = orders
    done = run(server, tmp_path, "transform", pg_url, str(tmp_path / "out"))
    assert done.returncode != 0
    assert (
        "poisonq.errors.InvalidOperationError: the pipeline runner's transform= needs the"
        " SparkContext"
    ) in done.stderr
    assert "use map=" in done.stderr
    assert broker.counts("orders")["active"] == ORDERS
