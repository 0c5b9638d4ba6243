"""A local SparkSession set up for poisonq: the demo, the tests and the benchmarks use it.

On a cluster, build your own session and call :func:`poisonq.spark.register`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

# Errors only, and not the stacks of failed tasks (the pipeline runner reports its jobs).
_LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
_QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


@contextmanager
def quiet_query_errors() -> Iterator[None]:
    """PySpark logs each error it raises with a query context (an analysis error, a failed
    job) with the JVM's whole stack, as JSON on stderr. Where poisonq handles those errors
    and reports them itself, it silences that log."""
    loggers = [logging.getLogger(name) for name in _QUERY_CONTEXT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


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
        .config(
            "spark.driver.extraJavaOptions",
            "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
            f" -Dlog4j2.configurationFile={_LOG_CONFIG.as_uri()}",
        )
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")  # Spark sets WARN when a session starts
    from poisonq.spark import register

    register(spark)
    return spark
