"""The Spark runtime on a standalone cluster: a master and two workers on this machine
(``poisonq.testing.sparkcluster``), so executors run in JVMs of their own with Python
workers of their own, and nothing the driver holds in memory reaches a task unless the job
ships it. Each job is a ``spark-submit`` of ``tests/spark_jobs.py`` against the cluster,
over a PostgreSQL queue, and ends with the chaos suite's end-state check: every good order
in the output once, every bad one dead-lettered once with its reason, nothing held, the
audit balanced."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from poisonq.testing.sparkcluster import StandaloneCluster, spark_home
from tests.chaos.scenarios import output_ids
from tests.helpers import Orders
from tests.spark_jobs import PROGRAM, ROOT, TIMEOUT, environment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    """One cluster for the module (its JVMs take half a minute to start). Its daemons, and
    so the executors and their Python workers, find the checkout on their path, as an
    install of poisonq on every node would put it there."""
    with StandaloneCluster(workers=2, cores=1, memory="1g", python_path=[str(ROOT)]) as started:
        yield started.start()


def submit(cluster: StandaloneCluster, work: Path, *args: str) -> None:
    """``spark-submit`` a job of ``tests/spark_jobs.py`` to the cluster, in client mode."""
    conf = {
        **cluster.executor_conf,
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "2",
    }
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
    command += [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    command += [str(PROGRAM), args[0], "cluster", *args[1:]]
    log = work / f"{args[0]}.log"
    with open(log, "wb") as out:
        done = subprocess.run(
            command, cwd=work, env=environment(), stdout=out, stderr=subprocess.STDOUT,
            timeout=TIMEOUT, check=False,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text(errors="replace")[-5000:]


def ran_on_executors(cluster: StandaloneCluster, before: int) -> None:
    """Both workers started an executor for the job (its tasks ran there)."""
    started = cluster.executor_dirs()[before:]
    assert len({path.parent.parent.name for path in started}) == 2, started


@pytest.mark.parametrize("orders", [2], indirect=True)
def test_the_pipeline_runner_with_map_on_a_cluster(
    cluster: StandaloneCluster, orders: Orders, tmp_path: Path
) -> None:
    """Two orders also kill their Python worker: the crash fails the task (which a cluster
    retries before it fails the job), the runner writes the batch again under the crash
    guard, and each crashing order is abandoned until its deliveries run out."""
    before = len(cluster.executor_dirs())
    submit(cluster, tmp_path, "map", orders.url, str(tmp_path / "out"))
    assert orders.problems(output_ids(tmp_path / "out")) == "none"
    ran_on_executors(cluster, before)


def test_the_pipeline_runner_with_a_transform_and_an_expectation_on_a_cluster(
    cluster: StandaloneCluster, orders: Orders, tmp_path: Path
) -> None:
    """The gate's accumulator comes back from the executors' tasks to the driver."""
    submit(cluster, tmp_path, "transform", orders.url, str(tmp_path / "out"))
    assert orders.problems(output_ids(tmp_path / "out"), "ExpectationFailed") == "none"


def test_the_data_source_reads_a_queue_on_a_cluster(
    cluster: StandaloneCluster, orders: Orders, tmp_path: Path
) -> None:
    """A batch read is a peek: every message once in the output, all still in the queue."""
    submit(cluster, tmp_path, "read", orders.url, str(tmp_path / "out"))
    assert sorted(output_ids(tmp_path / "out")) == sorted(orders.good | orders.bad.keys())
    assert orders.broker.counts("orders")["active"] == orders.count


def test_a_streaming_query_with_foreach_batch_on_a_cluster(
    cluster: StandaloneCluster, orders: Orders, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    submit(cluster, tmp_path, "stream", orders.url, str(out), str(checkpoint))
    assert orders.problems(output_ids(out), "ExpectationFailed") == "none"
