"""A local SparkSession set up for poisonq: the demo, the tests and the benchmarks use it.

On a cluster, build your own session and call :func:`poisonq.spark.register`.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

# Loggers that print a failed task's whole stack, several times over, for every failed job.
# The pipeline runner reports the jobs it runs itself (one line, or one traceback when it
# stops), so in poisonq's own sessions they are off.
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",
    "org.apache.spark.util.Utils",
)


def local_session(app_name: str = "poisonq", cores: int = 2) -> SparkSession:
    """A quiet ``local[cores]`` session with the ``poisonq`` data source registered.

    Python workers must run this interpreter (else they fail to connect back); Spark logs
    only errors, and not those of failed tasks; a crashing Python worker prints its Python
    stack.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores * 2))
        .config("spark.python.worker.faulthandler.enabled", "true")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    for name in _TASK_FAILURE_LOGGERS:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    from poisonq.spark import register

    register(spark)
    return spark
