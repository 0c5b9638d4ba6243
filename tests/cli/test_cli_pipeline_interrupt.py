"""Ctrl-C of ``poisonq pipeline run`` as a terminal sends it: SIGINT to the whole process
group of a real command, in the middle of a batch's Spark job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from poisonq import Broker, Message
from tests.cli.conftest import run_json
from tests.helpers import assert_balanced, spark_store_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

url = spark_store_url

SLOW = """
import json
import time


def parse(message):
    time.sleep(0.02)  # a batch long enough to be interrupted in its Spark job
    return {"n": json.loads(message["body"])["n"]}
"""


@pytest.mark.slow
def test_ctrl_c_stops_a_run_in_one_line_with_code_130_and_the_next_run_finishes_its_batch(
    spark: SparkSession, url: str, api: Broker, tmp_path: Path
) -> None:
    """Ctrl-C in a batch's job ends the command with exit code 130 and one line saying
    what it left (no py4j traceback); the batch stays locked and the next run replays it,
    so every message is completed once and written once."""
    api.create_queue("orders", lock_duration=4)
    api.sender("orders").send([Message(body=json.dumps({"n": n})) for n in range(400)])
    job = tmp_path / "slow.py"
    job.write_text(SLOW)
    output = tmp_path / "out"
    args = ["pipeline", "run", f"{job}:parse", "--queue", "orders", "--schema", "n long"]
    args += ["--output", str(output), "--batch-size", "400"]
    command = [sys.executable, "-c", "from poisonq.cli import main; main()", "--url", url]
    # A session of its own: the signal goes to its process group, as a terminal's does.
    with subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    ) as process:  # fmt: skip
        deadline = time.monotonic() + 240
        while api.counts("orders")["locked"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # into the batch's job (400 rows take 4 s a core)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "reentrant" not in stderr, stderr
    said = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert said == [
        "interrupted: the batch in hand (400 message(s)) stays locked and is replayed by the"
        " next run of consumer 'pipeline', after up to half a lock duration making sure no"
        " other run holds it"
    ]
    assert "(interrupted)" in stdout
    assert api.counts("orders")["locked"] == 400

    report = run_json(url, *args)
    assert report["completed"] == 400
    rows = spark.read.parquet(str(output)).select("n").collect()
    assert sorted(row.n for row in rows) == list(range(400))
    assert_balanced(api)
