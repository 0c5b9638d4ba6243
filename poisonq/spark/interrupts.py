"""Ctrl-C during a pipeline run: an interrupt that leaves the run's state as a crash would,
and says so, instead of a traceback from inside py4j.

PySpark's SIGINT handler cancels every job of the session by calling the JVM from inside the
signal handler. The signal arrives while the main thread waits in a call to the JVM (a
Spark job), so that call is entered again on the same connection and py4j fails with
"reentrant call", a traceback in place of the interrupt. While a run is in the main thread,
Ctrl-C raises :class:`KeyboardInterrupt` where the run is, as Python's own handler does;
once the interrupt has left the call, the run's jobs (and only those: they carry a tag of
the session's, which Spark Connect has too, where a session has no ``SparkContext``) are
cancelled from the same thread.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import uuid
from collections.abc import Iterator

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

# py4j logs this, with a traceback, when an interrupt lands while the main thread reads the
# answer of a JVM call: it closes that connection and the JVM has closed it already.
_SHUTDOWN_NOISE = "Exception occurred while shutting down connection"


def _not_shutdown_noise(record: logging.LogRecord) -> bool:
    return record.getMessage() != _SHUTDOWN_NOISE


# What cancelling a run's jobs may meet once the interrupt came: the JVM or the Connect
# server gone too (their jobs with them).
_GONE = (Py4JError, PySparkException)


@contextlib.contextmanager
def interrupted_cleanly(spark: SparkSession) -> Iterator[None]:
    """Run the block's Spark jobs under a tag of their own, with Ctrl-C raising
    :class:`KeyboardInterrupt` there (unless Ctrl-C is ignored, as in a shell's background
    job, or this is not the main thread, where no handler can be set); on an interrupt,
    cancel those jobs and raise it on."""
    tag = f"poisonq-pipeline-{uuid.uuid4()}"
    spark.addTag(tag)
    handles = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    )
    before = signal.signal(signal.SIGINT, signal.default_int_handler) if handles else None
    py4j_log = logging.getLogger("py4j.clientserver")
    py4j_log.addFilter(_not_shutdown_noise)
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(*_GONE):
            spark.interruptTag(tag)
        raise
    finally:
        py4j_log.removeFilter(_not_shutdown_noise)
        if handles:
            signal.signal(signal.SIGINT, before)
        with contextlib.suppress(*_GONE):
            spark.removeTag(tag)
