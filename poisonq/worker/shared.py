"""The memory the crash guard shares with its children: the rows in, the results out.

Each is a memory file (``memfd``) that the caller creates and maps; the helper process
inherits its descriptor and maps it before it forks, and each child inherits that mapping,
so a row or a result is written once and read in place, and only a few words go through the
pipes. Each file has one writer at a time: the caller writes the rows before it tells a
child to run them, and the running child writes the results. A file only grows: a writer
that needs more room grows it, and a reader that finds a record past the end of its mapping
maps it again.

The rows are written in segments of :data:`SEGMENT` rows, so that a child that takes over
after a crash reads only the segment it starts in, not all the rows before it: each page its
rows fill is a page the child copies or clears. The results are records appended in row
order, each the pickled results of consecutive rows; the word at the start of the file says
where the last complete record ends, and is written after the record, so a child that dies
while writing one leaves the records before it intact.
"""

from __future__ import annotations

import marshal
import mmap
import os
import pickle
import struct
from collections.abc import Iterator, Sequence
from typing import Any

SEGMENT = 64  # rows written together: the most a child reads to take over after a crash
_WORD = struct.Struct("=Q")
_RECORD = struct.Struct("=QQ")  # a result record's length and the index of its first row
_SEGMENTS = struct.Struct("=QQ")  # the rows' header: how many segments, and rows per segment
_START_SIZE = 1 << 20
_MARSHALLED = b"m"
_PICKLED = b"p"


class SharedFile:
    """A memory file and this process's mapping of it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map = mmap.mmap(fd, max(os.fstat(fd).st_size, mmap.PAGESIZE))

    @classmethod
    def create(cls, name: str) -> SharedFile:
        """A new file; its descriptor is not inherited by a program the caller starts
        unless passed to it (``pass_fds``), but a fork keeps it."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(name)
        else:  # no memfd (macOS): an unlinked temporary file does the same
            import tempfile  # here: its imports would be in the helper, and so in every fork

            fd, path = tempfile.mkstemp(prefix=name)
            os.unlink(path)
        os.ftruncate(fd, _START_SIZE)
        return cls(fd)

    def reserve(self, size: int) -> None:
        """Room for ``size`` bytes, growing the file (by doubling) if it is smaller."""
        if size > os.fstat(self.fd).st_size:
            os.ftruncate(self.fd, max(size, 2 * os.fstat(self.fd).st_size))
        self.follow(size)

    def follow(self, size: int) -> None:
        """Map the file again if ``size`` bytes are past this mapping (another process
        grew it)."""
        if size > len(self.map):
            self.map.close()
            self.map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def write_rows(file: SharedFile, rows: Sequence[Any]) -> None:
    """Write ``rows`` in segments, with the table of where each segment starts."""
    payloads = [_dumps(rows[start : start + SEGMENT]) for start in range(0, len(rows), SEGMENT)]
    table = struct.Struct(f"={len(payloads) + 1}Q")
    offset = _SEGMENTS.size + table.size
    offsets = [offset]
    for payload in payloads:
        offset += len(payload)
        offsets.append(offset)
    file.reserve(offset)
    _SEGMENTS.pack_into(file.map, 0, len(payloads), SEGMENT)
    table.pack_into(file.map, _SEGMENTS.size, *offsets)
    for payload, start in zip(payloads, offsets[:-1], strict=True):
        file.map[start : start + len(payload)] = payload


def read_segments(file: SharedFile, start: int, stop: int) -> Iterator[tuple[int, list[Any]]]:
    """The segments that hold rows ``start`` to ``stop`` (exclusive), each with the index
    of its first row, read one at a time."""
    count, per_segment = _SEGMENTS.unpack_from(file.map, 0)
    table = struct.Struct(f"={count + 1}Q")
    file.follow(_SEGMENTS.size + table.size)
    offsets = table.unpack_from(file.map, _SEGMENTS.size)
    file.follow(offsets[-1])
    for segment in range(start // per_segment, (stop - 1) // per_segment + 1):
        rows = _loads(file.map[offsets[segment] : offsets[segment + 1]])
        yield segment * per_segment, rows


def _dumps(rows: Sequence[Any]) -> bytes:
    """A segment of rows as bytes: marshalled when they are made of builtin values only
    (the store's lease rows are tuples of them), which costs a third of a pickle to write;
    else pickled. The first byte says which."""
    try:
        return _MARSHALLED + marshal.dumps(rows)  # type: ignore[arg-type]  # else ValueError
    except ValueError:  # an object marshal does not know (a ReceivedMessage)
        return _PICKLED + pickle.dumps(rows, pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes) -> Any:
    return marshal.loads(data[1:]) if data[:1] == _MARSHALLED else pickle.loads(data[1:])


def clear_results(file: SharedFile) -> None:
    _WORD.pack_into(file.map, 0, _WORD.size)


def append_results(file: SharedFile, first: int, results: list[Any]) -> None:
    """Append the results of rows ``first`` onwards, then mark the record complete."""
    payload = pickle.dumps(results, pickle.HIGHEST_PROTOCOL)
    (end,) = _WORD.unpack_from(file.map, 0)
    start = end + _RECORD.size
    file.reserve(start + len(payload))
    _RECORD.pack_into(file.map, end, len(payload), first)
    file.map[start : start + len(payload)] = payload
    _WORD.pack_into(file.map, 0, start + len(payload))


def read_results(file: SharedFile, since: int) -> tuple[int, list[tuple[int, list[Any]]]]:
    """The records completed since offset ``since`` (each the index of its first row and
    its results), and the offset to read from next time."""
    (end,) = _WORD.unpack_from(file.map, 0)
    file.follow(end)
    records = []
    while since < end:
        size, first = _RECORD.unpack_from(file.map, since)
        since += _RECORD.size
        records.append((first, pickle.loads(file.map[since : since + size])))
        since += size
    return since, records


def results_start() -> int:
    """Where the first record of a cleared results file is."""
    return _WORD.size
