"""A local SparkSession set up for poisonq: the demo, the tests and the benchmarks use it.

On a cluster, build your own session and call :func:`poisonq.spark.register`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark import SparkContext
from pyspark.sql import SparkSession

# Spark's logging in local_session(): errors only, and not the stacks of failed tasks (the
# pipeline runner reports its jobs). docs/spark.md tells how to give it to any session.
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
_QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


# The JVM's loggers of a failed task: each prints the error's Java stack (with a Python
# worker's traceback in it) for every failed task, and a failed write more than once.
TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",
    "org.apache.spark.util.Utils",
    "org.apache.spark.api.python",
    "org.apache.spark.sql.execution.python",
)
_quiet = threading.Lock()
_quieted: list[Callable[[], None]] = []  # how to restore the JVM's loggers, while quiet
_depth = 0  # jobs in quiet_query_errors now (the runner's look-ahead overlaps them)
_verbose = False


@contextmanager
def quiet_query_errors() -> Iterator[None]:
    """Silence the logs of the errors of the jobs run inside, which poisonq handles and
    reports itself (the runner's batches and isolation jobs, ``foreach_batch``), in any
    session, not only :func:`local_session`'s: PySpark's log of each error it raises with a
    query context (the JVM's whole stack as JSON on stderr), and the JVM's loggers of failed
    tasks (:data:`TASK_FAILURE_LOGGERS`), which are put back as they were when the last
    such job ends. :func:`show_job_errors` (``--verbose``) keeps them all."""
    global _depth
    if _verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in _QUERY_CONTEXT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    with _quiet:
        _depth += 1
        if _depth == 1:
            # A JVM logging with something else than Log4j 2's core stays as it is.
            with suppress(Py4JError):
                _quieted.extend(_silence_task_failures())
    try:
        yield
    finally:
        with _quiet:
            _depth -= 1
            if _depth == 0:
                for restore in _quieted:
                    with suppress(Py4JError):  # a connection an interrupt broke mid-call
                        restore()
                _quieted.clear()
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _silence_task_failures() -> list[Callable[[], None]]:
    """Turn the task failure loggers of this process's JVM off (Log4j 2, Spark's since
    3.3); what puts each back: its own level, or no level of its own. None without a JVM
    here (a Spark Connect client)."""
    context = _log_context()
    if context is None:
        return []
    log4j = SparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    config = context.getConfiguration()
    undo: list[Callable[[], None]] = []
    for name in TASK_FAILURE_LOGGERS:
        own = config.getLoggers().get(name)
        if own is None:
            config.addLogger(name, log4j.core.config.LoggerConfig(name, log4j.Level.OFF, True))
            undo.append(partial(config.removeLogger, name))
        else:
            level = own.getLevel()
            own.setLevel(log4j.Level.OFF)
            undo.append(partial(own.setLevel, level))
    context.updateLoggers()
    return [*undo, context.updateLoggers]


def _log_context() -> Any:
    """The JVM's Log4j context, if this process drives a JVM with a running SparkContext."""
    active = SparkContext._active_spark_context
    if active is None or SparkContext._jvm is None:
        return None
    return SparkContext._jvm.org.apache.logging.log4j.LogManager.getContext(False)


def show_job_errors() -> None:
    """Log every error of the jobs poisonq handles, with its stacks (``--verbose``): turn
    :func:`quiet_query_errors` off, and the task failure loggers that
    :func:`local_session`'s Log4j file turns off back on (at ``WARN``)."""
    global _verbose
    _verbose = True
    context = _log_context()
    if context is None:
        return
    warn = SparkContext._jvm.org.apache.logging.log4j.Level.WARN  # type: ignore[union-attr]
    config = context.getConfiguration()
    for name in TASK_FAILURE_LOGGERS:
        own = config.getLoggers().get(name)
        if own is not None:
            own.setLevel(warn)
    context.updateLoggers()


def local_session(app_name: str = "poisonq", cores: int = 2) -> SparkSession:
    """A quiet ``local[cores]`` session with the ``poisonq`` data source registered.

    Python workers must run this interpreter (else they fail to connect back); Spark logs
    only errors, and not those of failed tasks; a crashing Python worker prints its Python
    stack, and one whose task Spark cancelled prints nothing (:mod:`poisonq.pyspark_daemon`).
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
        .config("spark.python.daemon.module", "poisonq.pyspark_daemon")
        .config(
            "spark.driver.extraJavaOptions",
            "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
            f" -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
        )
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")  # Spark sets WARN when a session starts
    from poisonq.spark import register

    register(spark)
    return spark
