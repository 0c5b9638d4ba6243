"""``format("poisonq")`` in a SparkSession that never called ``poisonq.spark.register``: a
notebook, a ``spark-submit`` job. PySpark finds the top-level module ``pyspark_poisonq`` on the
Python path of its workers with ``pkgutil.iter_modules``, which sees only ``sys.path`` entries:
an installed wheel puts the module in site-packages, and the development install
(``make install``, editable) puts the checkout's root there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import poisonq
import pyspark_poisonq
from poisonq.spark.source import PoisonqDataSource

PLAIN_SESSION = """
import sys
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
rows = spark.read.format("poisonq").option("url", sys.argv[1]).option("queue", "orders").load()
print(sorted(row.body.decode() for row in rows.collect()))
"""


def test_the_module_names_the_data_source() -> None:
    assert pyspark_poisonq.DefaultSource is PoisonqDataSource
    assert pyspark_poisonq.DefaultSource.name() == "poisonq"


def test_a_plain_spark_session_resolves_the_format(tmp_path: Path) -> None:
    """Run in another directory with nothing added to the Python path: the interpreter's own
    install is what the workers' lookup finds."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([poisonq.Message(body=b"a"), poisonq.Message(body=b"b")])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    script = tmp_path / "job.py"
    script.write_text(PLAIN_SESSION)
    done = subprocess.run(
        [sys.executable, str(script), url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "['a', 'b']"
