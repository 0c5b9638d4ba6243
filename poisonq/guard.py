"""Running a user's transform so that a crash takes down one message, not the Spark job.

Python exceptions are easy: they are caught per row and become data (:class:`Failed`). A
crash is not: ``os._exit``, a segfault in a native library or the out-of-memory killer end the
Python worker, Spark fails the task and with it the whole micro-batch. So the transform runs
in a forked child process that streams its results back through a pipe in chunks, and writes
the index of the row it is on into a word of shared memory before each row. When the child
dies, that word names the row that killed it (:class:`Crashed`); the results it sent are
kept, the rows it finished but had not sent yet are run again, and a new child goes on after
the crashing row. No extra Spark job is needed.

The children are forked from a lean helper process, not from the Spark worker: a fork costs
in proportion to the memory of the process forked, about 15 ms for a Python worker with
pyarrow and pandas loaded against about 2.5 ms for the helper, and a crashing message
crashes once per delivery. Each Python worker keeps one helper per transform (a cache, not
state: a lost helper is started again).
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from poisonq.errors import PermanentError
from poisonq.failures import failure_from_exception
from poisonq.model import FailureRecord

Transform = Callable[[dict[str, Any]], dict[str, Any] | None]
CHUNK = 1024
_HEADER = struct.Struct("!I")
_PROGRESS = struct.Struct("q")


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
    return _helper(transform, permanent).run(rows)


_HELPERS: dict[bytes, Helper] = {}


def _helper(transform: Transform, permanent: tuple[type[BaseException], ...]) -> Helper:
    from pyspark import cloudpickle  # pickles functions by value, as Spark ships them

    key: bytes = cloudpickle.dumps((transform, permanent))  # type: ignore[no-untyped-call]
    helper = _HELPERS.get(key)
    if helper is None or not helper.alive:
        helper = _HELPERS[key] = Helper(key)
    return helper


class Helper:
    """The lean process that forks a child per run of the transform."""

    def __init__(self, pickled_transform: bytes) -> None:
        self._process = subprocess.Popen(
            # Not ``-m poisonq.guard``: results must pickle as poisonq.guard's classes.
            [sys.executable, "-c", "from poisonq.guard import helper_main; helper_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._send_bytes(pickled_transform)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def run(self, rows: Sequence[dict[str, Any]]) -> list[Result]:
        results: dict[int, Result] = {}
        self._send(("rows", list(rows)))
        while len(results) < len(rows):
            todo = [index for index in range(len(rows)) if index not in results]
            self._send(("run", todo))
            while isinstance(frame := self._receive(), list):
                for index, item in frame:
                    results[index] = item if isinstance(item, Failed) else Ok(item)
            _, status, at = frame
            if len(results) < len(rows):
                if at < 0:
                    raise RuntimeError(
                        f"the transform process died before its first row ({status})"
                    )
                results[todo[at]] = Crashed(_crash_record(status))
        return [results[index] for index in range(len(rows))]

    def _send(self, message: tuple[str, Any]) -> None:
        self._send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def _send_bytes(self, data: bytes) -> None:
        pipe = self._process.stdin
        assert pipe is not None
        pipe.write(_HEADER.pack(len(data)) + data)
        pipe.flush()

    def _receive(self) -> Any:
        assert self._process.stdout is not None
        frame = _read_frame(self._process.stdout)
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
        message=f"the Python process transforming this message died ({how})",
        fingerprint=f"crash-{how.replace(' ', '-')}",
    )


def helper_main() -> None:
    """The helper: load the transform, then fork a child for every run it is asked for."""
    frames = os.dup(1)
    os.dup2(2, 1)  # a transform that prints must not write into the frames
    requests = sys.stdin.buffer
    first = _read_frame(requests)
    if first is None:
        return
    transform, permanent = pickle.loads(first)
    rows: list[dict[str, Any]] = []
    with mmap.mmap(-1, _PROGRESS.size) as progress:  # shared with the children
        while (frame := _read_frame(requests)) is not None:
            kind, payload = pickle.loads(frame)
            if kind == "rows":
                rows = payload
                continue
            _PROGRESS.pack_into(progress, 0, -1)
            pid = os.fork()
            if pid == 0:  # the child: never returns, never runs the helper's cleanup
                code = 0
                try:
                    _child(transform, rows, payload, permanent, progress, frames)
                except BaseException:
                    code = 70
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            (at,) = _PROGRESS.unpack_from(progress, 0)
            _write_frame(frames, pickle.dumps(("end", status, at)))


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


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(pipe: BinaryIO | IO[bytes]) -> bytes | None:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = pipe.read(size)
    return data if len(data) == size else None
