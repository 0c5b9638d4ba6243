"""A transform's exception in a child of the crash guard, taken down as plain data, and its
failure recorded from that data in the caller.

Recording a failure formats its traceback: the traceback module at work and ``linecache``
reading the lines of the source. In a child newly forked from the guard's helper, each page
that touches is a page the child copies (the refcounts of every object it reads are writes),
and every child after a crash pays that on its first failure (docs/speed.md, the crash
guard). So the child takes down only what the failure is made of, each exception of its
chain (the ``raise … from`` causes and the contexts) with its type's names, its text, its
notes and the positions of its frames (:func:`raised`), and the caller, in whose warm pages
that costs what it costs outside the guard, formats the traceback and computes the
fingerprint (:func:`failed_from`), through the code a failure outside the guard goes through
(:func:`poisonq.failures.failure_record`), so that the two are the same.

The data goes to the caller as a pickled :class:`Raised`, whose unpickling is that recording:
the caller reads a :class:`~poisonq.worker.results.Failed` where the child wrote a
:class:`Raised`, without a pass over the results to find them.
"""

from __future__ import annotations

import itertools
import linecache
import time
import traceback
from functools import lru_cache
from typing import Any

from poisonq.errors import PermanentError
from poisonq.user_frames import from_user_frames
from poisonq.worker.results import Failed, failed

# An exception of the chain: its type's module, qualified name and name, its text, its notes,
# its frames (file, line, last line, column, last column, function), the indexes in the chain
# of its cause and its context (-1: none), and whether its context is suppressed.
_Exception = tuple[str, str, str, str, Any, tuple[Any, ...], int, int, bool]


class Raised:
    """A failure as the child takes it down: see the module's docstring."""

    __slots__ = ("chain", "permanent", "time")

    def __init__(self, chain: tuple[_Exception, ...], permanent: bool, at: float) -> None:
        self.chain = chain
        self.permanent = permanent
        self.time = at

    def __reduce__(self) -> tuple[Any, ...]:
        return failed_from, (self.chain, self.permanent, self.time)


def raised(exc: Exception, permanent: tuple[type[BaseException], ...]) -> Raised | Failed:
    """The child's record of a transform's exception (what
    :func:`~poisonq.worker.results.failed` is outside the guard). An exception the caller
    could not remake from plain data as the traceback module formats it (an exception group,
    a ``SyntaxError``, a text that does not convert, notes that are not strings) is recorded
    here in full, as outside the guard."""
    chain = _chain(from_user_frames(exc))
    if chain is None:
        return failed(exc, permanent)
    return Raised(chain, isinstance(exc, (PermanentError, *permanent)), time.time())


def _chain(top: BaseException) -> tuple[_Exception, ...] | None:
    """``top`` and the exceptions it links to, each once (a chain can loop), ``top`` first."""
    order, index, chain = [top], {id(top): 0}, list[_Exception]()
    for exc in order:  # grows as the links are found
        kind, notes = type(exc), getattr(exc, "__notes__", None)
        if isinstance(exc, (BaseExceptionGroup, SyntaxError)) or not _plain(notes):
            return None
        try:
            text = str(exc)
        except Exception:
            return None
        if type(text) is not str or type(kind.__module__) is not str:
            return None
        links = []
        for linked in (exc.__cause__, exc.__context__):
            if linked is not None and id(linked) not in index:
                index[id(linked)] = len(order)
                order.append(linked)
            links.append(-1 if linked is None else index[id(linked)])
        frames = _frames(exc.__traceback__)
        cause, context = links
        names = (kind.__module__, kind.__qualname__, kind.__name__)
        chain.append((*names, text, notes, frames, cause, context, exc.__suppress_context__))
    return tuple(chain)


def _plain(notes: Any) -> bool:
    return notes is None or (type(notes) in (list, tuple) and all(type(n) is str for n in notes))


def _frames(tb: Any) -> tuple[tuple[Any, ...], ...]:
    """The frames of a traceback with the positions the traceback module shows (the line and
    columns of the instruction that raised, for its carets), read as it reads them."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        positions: tuple[Any, ...] = (None, None, None, None)
        if tb.tb_lasti >= 0:
            positions = next(itertools.islice(code.co_positions(), tb.tb_lasti // 2, None))
        if positions[0] is None:
            positions = (tb.tb_lineno, *positions[1:])
        frames.append((code.co_filename, *positions, code.co_name))
        tb = tb.tb_next
    return tuple(frames)


class _Replica(Exception):
    """An exception of a child remade in the caller: its type's names, its text (its one
    argument), its links and notes, and its frames, which the traceback module is given."""

    frames: traceback.StackSummary


@lru_cache(maxsize=256)
def _replica_type(module: str, qualname: str, name: str) -> type[_Replica]:
    return type(name, (_Replica,), {"__module__": module, "__qualname__": qualname})


def failed_from(chain: tuple[_Exception, ...], permanent: bool, at: float) -> Failed:
    """The failure the child took down, recorded as :func:`~poisonq.worker.results.failed`
    records it outside the guard: the exceptions remade, the traceback module's text of them
    given their frames, the fingerprint from the root cause's. (The failures module is
    imported here, in the caller: see :mod:`poisonq.worker.results`.)"""
    from poisonq.failures import failure_record, root_cause

    replicas = []
    for module, qualname, name, text, notes, frames, *_ in chain:
        replica = _replica_type(module, qualname, name)(text)
        if notes is not None:
            replica.__notes__ = notes
        replica.frames = _stack(frames)
        replicas.append(replica)
    for replica, (*_, cause, context, suppressed) in zip(replicas, chain, strict=True):
        replica.__cause__ = replicas[cause] if cause >= 0 else None  # sets the suppression:
        replica.__context__ = replicas[context] if context >= 0 else None
        replica.__suppress_context__ = suppressed  # so after it
    top = replicas[0]
    # What traceback.format_exception does, the frames given rather than walked.
    summary = traceback.TracebackException(type(top), top, None, compact=True)
    pending: list[tuple[traceback.TracebackException, BaseException | None]] = [(summary, top)]
    while pending:
        formatted, remade = pending.pop()
        assert isinstance(remade, _Replica)
        formatted.stack = remade.frames
        if formatted.__cause__ is not None:
            pending.append((formatted.__cause__, remade.__cause__))
        if formatted.__context__ is not None:
            pending.append((formatted.__context__, remade.__context__))
    root = root_cause(top)
    assert isinstance(root, _Replica)
    text = "".join(summary.format())
    return Failed(failure_record(top, at, text, root.frames), permanent)


def _stack(frames: tuple[tuple[Any, ...], ...]) -> traceback.StackSummary:
    """The frames as the traceback module's summary of them; each file's cached lines are
    checked against the file first, as the module does when it walks a traceback."""
    for filename in {frame[0] for frame in frames}:
        linecache.checkcache(filename)
    return traceback.StackSummary.from_list(
        [
            traceback.FrameSummary(
                file, line, name, lookup_line=False, end_lineno=last, colno=col, end_colno=end
            )
            for file, line, last, col, end, name in frames
        ]
    )
