"""Ctrl-C during a pipeline run: an interrupt that leaves the run's state as a crash would,
and says so, instead of a traceback from inside py4j.

PySpark's SIGINT handler cancels every job of the session by calling the JVM from inside the
signal handler. The signal arrives while the main thread waits in a call to the JVM (a
Spark job), so that call is entered again on the same connection and py4j fails with
"reentrant call", a traceback in place of the interrupt. While a run is in the main thread,
Ctrl-C raises :class:`KeyboardInterrupt` where the run is, as Python's own handler does;
once the interrupt has left the call, the run's jobs (and only those: they carry a job tag)
are cancelled from the same thread.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Iterator

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession


@contextlib.contextmanager
def interrupted_cleanly(spark: SparkSession) -> Iterator[None]:
    """Run the block's Spark jobs under a tag of their own, with Ctrl-C raising
    :class:`KeyboardInterrupt` there (unless Ctrl-C is ignored, as in a shell's background
    job, or this is not the main thread, where no handler can be set); on an interrupt,
    cancel those jobs and raise it on."""
    context = spark.sparkContext
    tag = f"poisonq-pipeline-{uuid.uuid4()}"
    context.addJobTag(tag)
    handles = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    )
    before = signal.signal(signal.SIGINT, signal.default_int_handler) if handles else None
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(Py4JError):  # the JVM is gone too: its jobs with it
            context.cancelJobsWithTag(tag)
        raise
    finally:
        if handles:
            signal.signal(signal.SIGINT, before)
        with contextlib.suppress(Py4JError):
            context.removeJobTag(tag)
