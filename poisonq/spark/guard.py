"""Running a user's transform so that a crash takes down one message, not the Spark job.

Python exceptions are easy: they are caught per row and become data (:class:`Failed`). A
crash is not: ``os._exit``, a segfault in a native library or the out-of-memory killer end the
Python worker, Spark fails the task and with it the whole micro-batch. So the transform runs
in a forked child process that streams its results back through a pipe in chunks. When the
child dies, the rows it acknowledged are kept, and the unacknowledged chunk is run again in a
new child that acknowledges every row: the row it dies on is the one that crashes
(:class:`Crashed`), and the work goes on after it. Isolation costs one fork per Arrow batch
when nothing crashes, and no extra Spark job when something does.
"""

from __future__ import annotations

import os
import pickle
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from poisonq.errors import PermanentError
from poisonq.failures import failure_from_exception
from poisonq.model import FailureRecord

Transform = Callable[[dict[str, Any]], dict[str, Any] | None]
CHUNK = 256
_HEADER = struct.Struct("!I")
_DONE = b"done"


@dataclass(frozen=True, slots=True)
class Ok:
    output: dict[str, Any] | None  # None: the transform filtered the message out


@dataclass(frozen=True, slots=True)
class Failed:
    failure: FailureRecord
    permanent: bool


@dataclass(frozen=True, slots=True)
class Crashed:
    failure: FailureRecord


Result = Ok | Failed | Crashed


def apply(
    transform: Transform, row: dict[str, Any], permanent: tuple[type[BaseException], ...]
) -> Ok | Failed:
    """One row through the transform, its exception turned into data. A
    :class:`PermanentError`, or one of the ``permanent`` types, is permanent."""
    try:
        return Ok(transform(row))
    except Exception as exc:  # the one place where a transform's failure is caught
        is_permanent = isinstance(exc, (PermanentError, *permanent))
        return Failed(failure_from_exception(exc, time.time()), is_permanent)


def run_inline(
    transform: Transform, rows: Sequence[dict[str, Any]], permanent: tuple[type[BaseException], ...]
) -> list[Result]:
    """Without isolation: a crash still ends the worker (for platforms without fork)."""
    return [apply(transform, row, permanent) for row in rows]


def run_isolated(
    transform: Transform, rows: Sequence[dict[str, Any]], permanent: tuple[type[BaseException], ...]
) -> list[Result]:
    """Every row's result, in order, with crashing rows as :class:`Crashed`."""
    results: list[Result] = []
    careful_until = -1  # rows up to here are acknowledged one by one
    while len(results) < len(rows):
        start = len(results)
        got, finished, status = _child_run(transform, rows, start, careful_until, permanent)
        results.extend(got)
        if finished:
            break
        dead_at = len(results)
        if dead_at <= careful_until:
            results.append(Crashed(_crash_record(status)))
        else:
            careful_until = dead_at + CHUNK - 1
    return results


def _crash_record(status: int) -> FailureRecord:
    if os.WIFSIGNALED(status):
        how = f"killed by signal {os.WTERMSIG(status)}"
    else:
        how = f"exit code {os.waitstatus_to_exitcode(status)}"
    return FailureRecord(
        time=time.time(),
        error_type="WorkerCrashed",
        message=f"the Python process transforming this message died ({how})",
        fingerprint=f"crash-{how.replace(' ', '-')}",
    )


def _child_run(
    transform: Transform,
    rows: Sequence[dict[str, Any]],
    start: int,
    careful_until: int,
    permanent: tuple[type[BaseException], ...],
) -> tuple[list[Result], bool, int]:
    """Fork a child for ``rows[start:]``; returns what it acknowledged, whether it got to
    the end, and its wait status."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's cleanup
        os.close(read_fd)
        code = 0
        try:
            _child(transform, rows, start, careful_until, permanent, write_fd)
        except BaseException:
            code = 70
        os._exit(code)
    os.close(write_fd)
    got: list[Result] = []
    finished = False
    with os.fdopen(read_fd, "rb") as pipe:
        while (frame := _read_frame(pipe)) is not None:
            if frame == _DONE:
                finished = True
                break
            got.extend(pickle.loads(frame))
    _, status = os.waitpid(pid, 0)
    return got, finished, status


def _child(
    transform: Transform,
    rows: Sequence[dict[str, Any]],
    start: int,
    careful_until: int,
    permanent: tuple[type[BaseException], ...],
    fd: int,
) -> None:
    pending: list[Result] = []
    for index in range(start, len(rows)):
        pending.append(apply(transform, rows[index], permanent))
        if index <= careful_until or len(pending) >= CHUNK:
            _write_frame(fd, pickle.dumps(pending))
            pending = []
    if pending:
        _write_frame(fd, pickle.dumps(pending))
    _write_frame(fd, _DONE)


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(pipe: BinaryIO) -> bytes | None:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = pipe.read(size)
    return data if len(data) == size else None
