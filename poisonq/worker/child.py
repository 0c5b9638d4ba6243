"""The crash guard's helper process and the children it forks: the side that runs the rows.

The helper loads the transform, then keeps one child running it and another forked ahead.
The caller (:class:`poisonq.worker.guard.Helper`) tells the running child, through the
helper's input, which span of the shared rows to run (:mod:`poisonq.worker.shared`). The
child writes the index of the row it is on into a word of memory it shares with the helper
before each row, and appends the results to the shared results every ``flush`` rows. When
the child dies in a row, the helper wakes the next child and tells the caller which row,
and the caller tells that child where to go on: the results written before the death are
kept, and the rows run since the last flush are run again, with the rows after the crashed
one, in one span that leaves that row out.

Only fixed-size words go through the pipes. This module imports what a child needs and no
more (no ``subprocess``): every page the helper holds is copied into each child's page
tables, and a crash costs a fork.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import signal
import struct
import sys
from typing import Any

from poisonq.worker.raised import raised
from poisonq.worker.results import RowTransform, apply
from poisonq.worker.shared import SharedFile, append_results, read_segments

BETWEEN_SPANS = -1  # the progress word outside a row
# The caller to a child: run rows start to stop, flush every n, leave row skip out (-1: none).
SPAN = struct.Struct("=qqqq")
REPLY = struct.Struct("=qqq")  # to the caller: DONE or CRASHED, the wait status, the row
DONE = 0
CRASHED = 1
_HEADER = struct.Struct("!I")
_PROGRESS = struct.Struct("q")


def helper_main() -> None:
    """The helper: load the transform, then keep a child running it until the rows end.
    Its arguments are the descriptors of the shared rows and results."""
    # Ctrl-C at a terminal reaches the whole process group: the caller decides what an
    # interrupt does to the row in hand, so the helper and its children do not die of it
    # (a child killed by it would read as the row's crash). The caller's end of the pipe
    # closing still ends them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Mapped here, before the forks: a child inherits the mappings (and maps a file again
    # only once it has grown), rather than making its own at the cost of copied pages.
    shared = (SharedFile(int(sys.argv[1])), SharedFile(int(sys.argv[2])))
    replies = os.dup(1)
    os.dup2(2, 1)  # a transform that prints must not write into the replies
    first = read_frame(0)
    if first is None:
        return
    try:
        transform, permanent = pickle.loads(first)
    except Exception as exc:  # a module it refers to is missing here: the caller retries
        write_frame(replies, pickle.dumps(("unloadable", f"{type(exc).__name__}: {exc}")))
        return
    write_frame(replies, pickle.dumps(("ready",)))
    _warm_up(transform, permanent)
    gc.freeze()  # a child's collections must not write to (and so copy) the helper's pages
    with mmap.mmap(-1, _PROGRESS.size) as progress:  # shared with the children
        child = _Child(transform, permanent, progress, replies, shared)
        pid = child.start(child.fork())
        standby = child.fork()
        while True:
            _, status = os.waitpid(pid, 0)
            (at,) = _PROGRESS.unpack_from(progress, 0)
            if at == BETWEEN_SPANS and status == 0:  # the rows ended
                os.close(standby[1])  # the standby reads the end and exits
                os.waitpid(standby[0], 0)
                return
            # The standby takes over before the caller hears of the crash, so it is awake
            # when the caller's next span arrives; a new one is forked beside it after.
            pid = child.start(standby)
            _write_all(replies, REPLY.pack(CRASHED, status, at))
            standby = child.fork()


class _Child:
    """What a child runs, and the forking of one ahead."""

    def __init__(
        self,
        transform: RowTransform,
        permanent: tuple[type[BaseException], ...],
        progress: mmap.mmap,
        replies: int,
        shared: tuple[SharedFile, SharedFile],
    ) -> None:
        self.transform = transform
        self.permanent = permanent
        self.progress = progress
        self.replies = replies
        self.shared = shared

    def fork(self) -> tuple[int, int]:
        """A child forked ahead, waiting to be told to run (its pid, and the pipe that
        tells it): after a crash the next child is ready, and its fork is off the rows'
        path."""
        wait, go = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns, never runs the helper's cleanup
            os.close(go)
            code = 0
            try:
                if os.read(wait, 2) == b"go":  # else the helper ended: not needed
                    self._run(*self.shared)
            except BaseException:
                code = 70
            os._exit(code)
        os.close(wait)
        return pid, go

    def start(self, forked: tuple[int, int]) -> int:
        """Wake a child forked ahead to run the caller's spans; its pid."""
        pid, go = forked
        _PROGRESS.pack_into(self.progress, 0, BETWEEN_SPANS)
        os.write(go, b"go")
        os.close(go)
        return pid

    def _run(self, rows: SharedFile, results: SharedFile) -> None:
        """Run the spans the caller sends until its end of the pipe closes."""
        at = memoryview(self.progress).cast("q")  # one store a row, not a pack_into call
        transform, permanent = self.transform, self.permanent
        while (span := _read_exact(0, SPAN.size)) is not None:
            start, stop, flush, skip = SPAN.unpack(span)
            first, outputs = start, list[Any]()
            for base, segment in read_segments(rows, start, stop):
                for part in around(range(max(start, base), min(stop, base + len(segment))), skip):
                    if first + len(outputs) != part.start:  # past the skipped row: a new record
                        if outputs:
                            append_results(results, first, outputs)
                        first, outputs = part.start, []
                    for position in part:
                        at[0] = position
                        row = segment[position - base]
                        outputs.append(apply(transform, row, permanent, raised))
                        if len(outputs) == flush:
                            append_results(results, first, outputs)
                            first, outputs = position + 1, []
            if outputs:
                append_results(results, first, outputs)
            at[0] = BETWEEN_SPANS
            _write_all(self.replies, REPLY.pack(DONE, 0, 0))


def _warm_up(transform: RowTransform, permanent: tuple[type[BaseException], ...]) -> None:
    """What a child would load on first use, loaded once, in the helper before it forks:

    - a row's failure taken down and pickled on the way to no row, so that the first failure
      a child takes down finds that code loaded. (Each child touching those pages still
      copies them; done again in each child forked ahead, it cost more than it saved: a
      child that takes over soon after its birth waits for it, and it copies pages the
      child's exit then frees.)
    - the transform's own ``warm_up()``, if its type has one: poisonq's wrappers of a
      function that takes Arrow data (:class:`poisonq.spark.batches.OnLeaseChunk`) build a
      batch there, since Arrow loads its compute functions and memory pool on the first
      use in a process, which would otherwise be every child's after a crash.
    """
    pickle.dumps([apply(_fail, None, permanent, raised)], pickle.HIGHEST_PROTOCOL)
    warm_up = getattr(type(transform), "warm_up", None)
    if warm_up is not None:
        warm_up(transform)


class _NoRow(Exception):
    """The failure :func:`_warm_up` takes down."""


def _fail(row: Any) -> None:
    raise _NoRow(row)


def around(rows: range, skip: int) -> list[range]:
    """The rows but ``skip``, in the spans before and after it that are not empty."""
    if skip not in rows:
        return [rows]
    return [part for part in (range(rows.start, skip), range(skip + 1, rows.stop)) if part]


def frame(data: bytes) -> bytes:
    """``data`` as a length-prefixed frame (the transform, and the helper's first reply)."""
    return _HEADER.pack(len(data)) + data


def write_frame(fd: int, data: bytes) -> None:
    _write_all(fd, frame(data))


def read_frame(fd: int) -> bytes | None:
    """One length-prefixed frame, read with exact-size reads: a child must never take bytes
    meant for the next child into a buffer that dies with it."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    return _read_exact(fd, size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int) -> bytes | None:
    parts = []
    while size:
        part = os.read(fd, min(size, 1 << 20))
        if not part:
            return None
        parts.append(part)
        size -= len(part)
    return b"".join(parts)
