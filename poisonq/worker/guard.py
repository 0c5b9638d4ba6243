"""Running a user's transform so that a crash takes down one message, not the Spark job.

Python exceptions are easy: they are caught per row and become data (:class:`Failed`). A
crash is not: ``os._exit``, a segfault in a native library or the out-of-memory killer end the
Python worker, Spark fails the task and with it the whole micro-batch. So the transform runs
in a child process (:mod:`poisonq.worker.child`). The rows go to it through shared memory
and its results come back the same way (:mod:`poisonq.worker.shared`), so that a call costs
one round trip of a few words through a pipe; before each row the child writes the row's
index into a word of memory it shares with its helper. When the child dies, that word names
the row that killed it (:class:`Crashed`), the results the child wrote before are kept, and a
new child goes on after that row, running again only the rows since the child's last record
of results (at most :data:`WINDOW`, fewer as crashes come more often). No extra Spark job is
needed, and a crash costs the death of a child and a fork.

The children are forked from a lean helper process, not from the Spark worker: a fork costs
in proportion to the memory of the process forked (a Python worker with pyarrow and pandas
loaded is many times the helper, which holds nothing but the transform: figures in
docs/speed.md), and a crashing message crashes once per delivery. The helper forks each child
ahead, while the one before works, and wakes it when that one dies, so a crash waits for the
death of its child but not for the birth of the next. Each Python worker keeps one helper per
transform (a cache, not state: a lost helper is started again).
"""

from __future__ import annotations

import atexit
import math
import os
import pickle
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from poisonq.model import FailureRecord
from poisonq.worker.child import DONE, REPLY, SPAN, around, frame, read_frame
from poisonq.worker.results import (
    Crashed,
    Failed,
    Result,
    RowTransform,
    Transform,
    apply,
    failed,
)
from poisonq.worker.shared import (
    SharedFile,
    clear_results,
    read_results,
    results_start,
    write_rows,
)

__all__ = [
    "CRASHED",
    "Crashed",
    "Failed",
    "Helper",
    "Result",
    "RowTransform",
    "Transform",
    "apply",
    "failed",
    "run_inline",
    "run_isolated",
    "start_helper",
]

CRASHED = "WorkerCrashed"  # the error type of a message whose child died in it
WINDOW = 256  # rows per record of results: the most work a crash can lose
MIN_WINDOW = 16


def run_inline(
    transform: RowTransform, rows: Sequence[Any], permanent: tuple[type[BaseException], ...]
) -> list[Result]:
    """Without isolation: a crash still ends the worker (for platforms without fork)."""
    return [apply(transform, row, permanent) for row in rows]


def run_isolated(
    transform: RowTransform,
    rows: Sequence[Any],
    permanent: tuple[type[BaseException], ...],
    window: int = WINDOW,
) -> list[Result]:
    """Every row's result, in order, with crashing rows as :class:`Crashed`. ``window`` is
    the most rows a crash can make the guard run again: a caller whose rows each cost far
    more than recording a result (a chunk of messages) gives 1."""
    return _helper(transform, permanent).run(rows, window)


_HELPERS: dict[bytes, Helper] = {}


@atexit.register
def _close_helpers() -> None:
    while _HELPERS:
        _HELPERS.popitem()[1].close()


def _helper(transform: RowTransform, permanent: tuple[type[BaseException], ...]) -> Helper:
    key = _pickled(transform, permanent)
    helper = _HELPERS.get(key)
    if helper is None or not helper.alive:
        if helper is not None:
            helper.close()
        helper = _HELPERS[key] = _start(key, transform, permanent)
    return helper


def start_helper(transform: RowTransform, permanent: tuple[type[BaseException], ...]) -> Helper:
    """A helper of the caller's own, which the caller closes: for a caller that runs one
    transform many times (the Processor's handler), pickled once rather than per call."""
    return _start(_pickled(transform, permanent), transform, permanent)


def _pickled(transform: RowTransform, permanent: tuple[type[BaseException], ...]) -> bytes:
    """The transform for the helper, pickled with the user's module by value when it can
    be: the helper then imports only what the transform itself refers to, not the rest of
    its module (a job file that imports pyspark and pyarrow makes every fork cost five
    times more). The module is that of the transform, or of the function it wraps
    (``transform.transform``, as :class:`poisonq.worker.lease_rows.OnLeaseRows` does)."""
    import cloudpickle  # the spark extra's; imported when a helper is started

    from poisonq.worker.pickling import dumps

    inner = getattr(transform, "transform", transform)
    module = sys.modules.get(getattr(inner, "__module__", None) or "")
    if (
        module is None
        or module.__name__ in ("__main__", "builtins")
        or module.__name__.startswith("poisonq")
    ):
        return dumps((transform, permanent))
    cloudpickle.register_pickle_by_value(module)
    try:
        return dumps((transform, permanent))
    except Exception:  # something in the module does not pickle: by reference, then
        pass
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    return dumps((transform, permanent))


def _start(
    light: bytes, transform: RowTransform, permanent: tuple[type[BaseException], ...]
) -> Helper:
    """A helper running the transform. cloudpickle pickles functions by value, as Spark ships
    them; the copy inside pyspark would make the helper import pyspark, which doubles the cost
    of every fork, so it is used only when the helper cannot load the light pickle (a module
    that pyspark's copy was told to pickle by value)."""
    try:
        return Helper(light)
    except _Unloadable:
        from pyspark import cloudpickle as spark_cloudpickle

        heavy: bytes = spark_cloudpickle.dumps((transform, permanent))  # type: ignore[no-untyped-call]
        try:
            return Helper(heavy)
        except _Unloadable as exc:
            raise RuntimeError(
                f"the guard's helper process cannot load the transform: {exc}"
            ) from None


class _Unloadable(Exception):
    """The helper process could not unpickle the transform."""


class Helper:
    """The lean process that keeps one child running the transform, and forks a new one when
    a child dies; the rows and the results go through memory shared with its children."""

    def __init__(self, pickled_transform: bytes) -> None:
        self._rows_in = SharedFile.create("poisonq-guard-rows")
        self._results = SharedFile.create("poisonq-guard-results")
        shared = (self._rows_in.fd, self._results.fd)
        self._process = subprocess.Popen(
            # Not ``-m``: results must pickle as the classes of poisonq.worker.results.
            [
                sys.executable,
                "-c",
                "from poisonq.worker.child import helper_main; helper_main()",
                *map(str, shared),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=shared,
        )
        self._send(frame(pickled_transform))
        assert self._process.stdout is not None
        ready = read_frame(self._process.stdout.fileno())
        if ready is None or pickle.loads(ready)[0] != "ready":
            self.close()
            why = "it ended" if ready is None else pickle.loads(ready)[1]
            raise _Unloadable(why)
        self._rows = 0  # run by the children so far, and how many of them crashed
        self._crashes = 0

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """End the helper: the end of its input ends its child, then itself."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()
        self._rows_in.close()
        self._results.close()

    def run(self, rows: Sequence[Any], window: int = WINDOW) -> list[Result]:
        """Every row's result, in order. A span of rows goes to the running child; when it
        dies in a row, that row is :class:`Crashed`, and the next child runs the rest of
        the span and the rows since the last results its predecessor wrote."""
        results: list[Result] = [None] * len(rows)
        write_rows(self._rows_in, rows)
        clear_results(self._results)
        read_at = results_start()
        todo = deque([range(len(rows))] if rows else [])  # spans of rows still to run, in order
        while todo:
            span, skip = todo.popleft(), -1
            if todo and todo[0].start == span.stop + 1:  # one span around the crashed row
                span, skip = range(span.start, todo.popleft().stop), span.stop
            self._send(SPAN.pack(span.start, span.stop, self._flush_every(window), skip))
            kind, status, at = self._receive()
            read_at, records = read_results(self._results, read_at)
            done = _taken(records, results, span.start)
            if kind == DONE:
                self._rows += len(span) - (skip >= 0)
                continue
            if at < 0:
                self._process.kill()
                raise RuntimeError(f"the transform process died outside a row ({status})")
            self._rows += at + 1 - span.start
            self._crashes += 1
            results[at] = Crashed(_crash_record(status))
            rest = (range(done, at), range(at + 1, span.stop))
            todo.extendleft(reversed([part for rows in rest for part in around(rows, skip)]))
        return results

    def _flush_every(self, window: int) -> int:
        """Rows per record of results: the most work a crash can lose, at most ``window``.
        A record costs at most about a row of work, and a crash loses half a record on
        average, so with ``d`` crashes per row the cheapest record is sqrt(2 / d) rows: 45 at
        one crash in 1,000 rows, all of the window without crashes."""
        if not self._crashes:
            return window
        return min(window, max(MIN_WINDOW, math.isqrt(2 * self._rows // self._crashes)))

    def _send(self, data: bytes) -> None:
        pipe = self._process.stdin
        assert pipe is not None
        pipe.write(data)
        pipe.flush()

    def _receive(self) -> tuple[int, int, int]:
        assert self._process.stdout is not None
        reply = self._process.stdout.read(REPLY.size)
        if len(reply) < REPLY.size:
            raise RuntimeError(f"the transform helper process ended ({self._process.wait()})")
        kind, status, at = REPLY.unpack(reply)
        return kind, status, at


def _taken(records: list[tuple[int, list[Result]]], results: list[Result], done: int) -> int:
    """Put the records' results in their rows' places; the row after the last of them
    (``done`` if there are none)."""
    for first, outputs in records:
        done = first + len(outputs)
        results[first:done] = outputs
    return done


def _crash_record(status: int) -> FailureRecord:
    if os.WIFSIGNALED(status):
        how = f"killed by signal {os.WTERMSIG(status)}"
    else:
        how = f"exit code {os.waitstatus_to_exitcode(status)}"
    return FailureRecord(
        time=time.time(),
        error_type=CRASHED,
        message=f"the Python process handling this message died ({how})",
        fingerprint=f"crash-{how.replace(' ', '-')}",
    )
