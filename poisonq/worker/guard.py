"""Running a user's transform so that a crash takes down one message, not the Spark job.

Python exceptions are easy: they are caught per row and become data (:class:`Failed`). A
crash is not: ``os._exit``, a segfault in a native library or the out-of-memory killer end the
Python worker, Spark fails the task and with it the whole micro-batch. So the transform runs
in a child process that takes rows in windows of :data:`WINDOW` through a pipe, sends each
window's results back, and writes the position of the row it is on into a word of shared
memory before each row. When the child dies, that word names the row that killed it
(:class:`Crashed`); the rows of that window before it are sent again, and a new child goes on.
No extra Spark job is needed, and a crash costs one fork and at most a window of lost work.

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
import gc
import math
import mmap
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from poisonq.errors import PermanentError
from poisonq.failures import failure_from_exception
from poisonq.model import FailureRecord

Transform = Callable[[dict[str, Any]], dict[str, Any] | None]
RowTransform = Callable[[Any], dict[str, Any] | None]  # what the guard runs: any row type
WINDOW = 256  # rows per round trip to the child: the most work a crash can lose
MIN_WINDOW = 16
_BETWEEN_WINDOWS = -1
_HEADER = struct.Struct("!I")
_PROGRESS = struct.Struct("q")


@dataclass(frozen=True, slots=True)
class Failed:
    failure: FailureRecord
    permanent: bool


@dataclass(frozen=True, slots=True)
class Crashed:
    failure: FailureRecord


# A row's result is what the transform returned (``None``: it filtered the message out), or
# one of these two. A bare output, not a wrapper: one object per row would cost as much as a
# typical transform, in the child and again in the pickles between the processes.
Result = Any


def apply(transform: RowTransform, row: Any, permanent: tuple[type[BaseException], ...]) -> Any:
    """One row through the transform: its output, or its exception as :class:`Failed`."""
    try:
        return transform(row)
    except Exception as exc:  # the one place where a transform's failure is caught
        return failed(exc, permanent)


def failed(exc: Exception, permanent: tuple[type[BaseException], ...]) -> Failed:
    """A transform's exception as data: a :class:`PermanentError`, or one of the
    ``permanent`` types, is permanent."""
    is_permanent = isinstance(exc, (PermanentError, *permanent))
    return Failed(failure_from_exception(exc, time.time()), is_permanent)


def run_inline(
    transform: RowTransform, rows: Sequence[Any], permanent: tuple[type[BaseException], ...]
) -> list[Result]:
    """Without isolation: a crash still ends the worker (for platforms without fork)."""
    return [apply(transform, row, permanent) for row in rows]


def run_isolated(
    transform: RowTransform, rows: Sequence[Any], permanent: tuple[type[BaseException], ...]
) -> list[Result]:
    """Every row's result, in order, with crashing rows as :class:`Crashed`."""
    return _helper(transform, permanent).run(rows)


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
    import cloudpickle

    inner = getattr(transform, "transform", transform)
    module = sys.modules.get(getattr(inner, "__module__", None) or "")
    if (
        module is None
        or module.__name__ in ("__main__", "builtins")
        or module.__name__.startswith("poisonq")
    ):
        return bytes(cloudpickle.dumps((transform, permanent)))
    cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps((transform, permanent)))
    except Exception:  # something in the module does not pickle: by reference, then
        pass
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    return bytes(cloudpickle.dumps((transform, permanent)))


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
    a child dies."""

    def __init__(self, pickled_transform: bytes) -> None:
        self._process = subprocess.Popen(
            # Not ``-m poisonq.worker.guard``: results must pickle as that module's classes.
            [sys.executable, "-c", "from poisonq.worker.guard import helper_main; helper_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._send(pickled_transform)
        match self._receive():
            case ("unloadable", why):
                self.close()
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

    def run(self, rows: Sequence[Any]) -> list[Result]:
        results: list[Result] = [None] * len(rows)
        todo = deque([range(len(rows))])  # spans of rows still to run, in order
        while todo:
            span = todo.popleft()
            size = self._window()
            window = span[:size]
            if len(span) > size:
                todo.appendleft(span[size:])
            self._send(pickle.dumps(rows[window.start : window.stop], pickle.HIGHEST_PROTOCOL))
            match self._receive():
                case ("done", outputs):
                    self._rows += len(window)
                    results[window.start : window.stop] = outputs
                case ("crashed", status, at) if at >= 0:
                    self._rows += at + 1
                    self._crashes += 1
                    results[window[at]] = Crashed(_crash_record(status))
                    todo.extendleft(part for part in (window[at + 1 :], window[:at]) if part)
                case ("crashed", status, _):
                    self._process.kill()
                    raise RuntimeError(f"the transform process died outside a row ({status})")
        return results

    def _window(self) -> int:
        """Rows per round trip. A round trip costs about two rows of work, and a crash loses
        half a window on average, so with ``d`` crashes per row the cheapest window is
        sqrt(4 / d) rows: 28 at one crash in 200 rows, all of :data:`WINDOW` without crashes."""
        if not self._crashes:
            return WINDOW
        return max(MIN_WINDOW, min(WINDOW, math.isqrt(4 * self._rows // self._crashes)))

    def _send(self, data: bytes) -> None:
        pipe = self._process.stdin
        assert pipe is not None
        pipe.write(_HEADER.pack(len(data)) + data)
        pipe.flush()

    def _receive(self) -> Any:
        assert self._process.stdout is not None
        frame = _read_frame(self._process.stdout.fileno())
        if frame is None:
            raise RuntimeError(f"the transform helper process ended ({self._process.wait()})")
        return pickle.loads(frame)


def _crash_record(status: int) -> FailureRecord:
    if os.WIFSIGNALED(status):
        how = f"killed by signal {os.WTERMSIG(status)}"
    else:
        how = f"exit code {os.waitstatus_to_exitcode(status)}"
    return FailureRecord(
        time=time.time(),
        error_type="WorkerCrashed",
        message=f"the Python process handling this message died ({how})",
        fingerprint=f"crash-{how.replace(' ', '-')}",
    )


def helper_main() -> None:
    """The helper: load the transform, then keep a child running it until the rows end."""
    # Ctrl-C at a terminal reaches the whole process group: the caller decides what an
    # interrupt does to the row in hand, so the helper and its children do not die of it
    # (a child killed by it would read as the row's crash). The caller's end of the pipe
    # closing still ends them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.dup(1)
    os.dup2(2, 1)  # a transform that prints must not write into the replies
    first = _read_frame(0)
    if first is None:
        return
    try:
        transform, permanent = pickle.loads(first)
    except Exception as exc:  # a module it refers to is missing here: the caller retries
        _write_frame(replies, pickle.dumps(("unloadable", f"{type(exc).__name__}: {exc}")))
        return
    _write_frame(replies, pickle.dumps(("ready",)))
    gc.freeze()  # a child's collections must not write to (and so copy) the helper's pages
    with mmap.mmap(-1, _PROGRESS.size) as progress:  # shared with the children
        standby = _standby(transform, permanent, progress, replies)
        while True:
            _PROGRESS.pack_into(progress, 0, _BETWEEN_WINDOWS)
            pid, go = standby
            os.write(go, b"go")  # the standby takes over; a new one is forked beside it
            os.close(go)
            standby = _standby(transform, permanent, progress, replies)
            _, status = os.waitpid(pid, 0)
            (at,) = _PROGRESS.unpack_from(progress, 0)
            if at == _BETWEEN_WINDOWS and status == 0:  # the rows ended
                os.close(standby[1])  # the standby reads the end and exits
                os.waitpid(standby[0], 0)
                return
            _write_frame(replies, pickle.dumps(("crashed", status, at)))


def _standby(
    transform: RowTransform,
    permanent: tuple[type[BaseException], ...],
    progress: mmap.mmap,
    replies: int,
) -> tuple[int, int]:
    """A child forked ahead, waiting to be told to run (its pid, and the pipe that tells
    it): after a crash the next child is ready, and its fork is off the rows' path."""
    wait, go = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the helper's cleanup
        os.close(go)
        code = 0
        try:
            if os.read(wait, 2) == b"go":  # else the helper ended: not needed
                _child(transform, permanent, progress, replies)
        except BaseException:
            code = 70
        os._exit(code)
    os.close(wait)
    return pid, go


def _child(
    transform: RowTransform,
    permanent: tuple[type[BaseException], ...],
    progress: mmap.mmap,
    replies: int,
) -> None:
    while (frame := _read_frame(0)) is not None:
        outputs: list[Result] = []
        for position, row in enumerate(pickle.loads(frame)):
            _PROGRESS.pack_into(progress, 0, position)
            outputs.append(apply(transform, row, permanent))
        _PROGRESS.pack_into(progress, 0, _BETWEEN_WINDOWS)
        _write_frame(replies, pickle.dumps(("done", outputs), pickle.HIGHEST_PROTOCOL))


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(fd: int) -> bytes | None:
    """One length-prefixed frame, read with exact-size reads: a child must never take bytes
    of the next window into a buffer that dies with it."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    return _read_exact(fd, size)


def _read_exact(fd: int, size: int) -> bytes | None:
    parts = []
    while size:
        part = os.read(fd, min(size, 1 << 20))
        if not part:
            return None
        parts.append(part)
        size -= len(part)
    return b"".join(parts)
