"""Running a user's transform so that a crash takes down one message, not the Spark job.

Python exceptions are easy: they are caught per row and become data (:class:`Failed`). A
crash is not: ``os._exit``, a segfault in a native library or the out-of-memory killer end the
Python worker, Spark fails the task and with it the whole micro-batch. So the transform runs
in a forked child process that streams its results back through a pipe in chunks, and writes
the index of the row it is on into a word of shared memory before each row. When the child
dies, that word names the row that killed it (:class:`Crashed`); the results it sent are
kept, the rows it finished but had not sent yet are run again, and a new child goes on after
the crashing row. Isolation costs one fork per Arrow batch, plus one per crash (a fork of a
Python worker takes about 15 ms here), and no extra Spark job.
"""

from __future__ import annotations

import mmap
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
CHUNK = 1024
_HEADER = struct.Struct("!I")
_PROGRESS = struct.Struct("q")
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
    results: dict[int, Result] = {}
    with mmap.mmap(-1, _PROGRESS.size) as progress:  # shared with the children
        while len(results) < len(rows):
            todo = [index for index in range(len(rows)) if index not in results]
            _PROGRESS.pack_into(progress, 0, -1)
            got, status = _child_run(transform, rows, todo, permanent, progress)
            results.update(got)
            if status is None:
                continue  # the child got to the end
            (at,) = _PROGRESS.unpack_from(progress, 0)
            if at < 0:
                raise RuntimeError(f"the transform process died before its first row ({status})")
            results[todo[at]] = Crashed(_crash_record(status))
    return [results[index] for index in range(len(rows))]


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
    todo: list[int],
    permanent: tuple[type[BaseException], ...],
    progress: mmap.mmap,
) -> tuple[dict[int, Result], int | None]:
    """Fork a child for the rows ``todo``; returns the results it sent and, if it died
    before the end, its wait status."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's cleanup
        os.close(read_fd)
        code = 0
        try:
            _child(transform, rows, todo, permanent, progress, write_fd)
        except BaseException:
            code = 70
        os._exit(code)
    os.close(write_fd)
    got: dict[int, Result] = {}
    finished = False
    with os.fdopen(read_fd, "rb") as pipe:
        while (frame := _read_frame(pipe)) is not None:
            if frame == _DONE:
                finished = True
                break
            for index, item in pickle.loads(frame):
                got[index] = item if isinstance(item, Failed) else Ok(item)
    _, status = os.waitpid(pid, 0)
    return got, None if finished and status == 0 else status


def _child(
    transform: Transform,
    rows: Sequence[dict[str, Any]],
    todo: list[int],
    permanent: tuple[type[BaseException], ...],
    progress: mmap.mmap,
    fd: int,
) -> None:
    # A good row travels as its bare output: pickling a dataclass per row would cost more
    # than a typical transform.
    pending: list[tuple[int, Failed | dict[str, Any] | None]] = []
    for position, index in enumerate(todo):
        _PROGRESS.pack_into(progress, 0, position)
        result = apply(transform, rows[index], permanent)
        pending.append((index, result.output if isinstance(result, Ok) else result))
        if len(pending) >= CHUNK:
            _write_frame(fd, pickle.dumps(pending, pickle.HIGHEST_PROTOCOL))
            pending = []
    if pending:
        _write_frame(fd, pickle.dumps(pending, pickle.HIGHEST_PROTOCOL))
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
