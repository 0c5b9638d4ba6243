"""Failure records and their fingerprints.

A fingerprint groups failures the way ServiceControl does: the *root-cause* exception type
(the innermost of a ``raise ... from`` chain, not the wrapper) plus the frame where it was
raised, with the message text left out. So ``KeyError: 'cust-17'`` and ``KeyError: 'cust-42'``
raised at the same place fall in one group, while the same type raised elsewhere does not.
"""

from __future__ import annotations

import hashlib
import os
import traceback
from collections.abc import Sequence

from poisonq.limits import MAX_MESSAGE, MAX_TRACEBACK, tail
from poisonq.model import DeadLetter, FailureRecord
from poisonq.user_frames import from_user_frames


def root_cause(exc: BaseException) -> BaseException:
    """Follow ``__cause__`` (or an unsuppressed ``__context__``) to the innermost exception."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (Spark's errors go on with the JVM's stack and
    a query's context), or its type's name when it has no text."""
    return next(iter(str(exc).strip().splitlines()), type(exc).__name__)


def type_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def fingerprint(exc: BaseException) -> str:
    """A short stable id of (root-cause type, the frame that raised it)."""
    root = root_cause(exc)
    return _fingerprint(root, traceback.extract_tb(root.__traceback__))


def _fingerprint(root: BaseException, frames: Sequence[traceback.FrameSummary]) -> str:
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else ""
    return hashlib.sha1(f"{type_name(root)}|{where}".encode()).hexdigest()[:16]


def failure_from_exception(exc: BaseException, now: float) -> FailureRecord:
    """The failure record of one attempt that raised ``exc``: its type is the root cause's,
    and so is the start of its message, which goes on with the exception the code raised
    (``'cust-17' → RuntimeError: order failed``), so that each type is told with its text."""
    text = "".join(traceback.format_exception(from_user_frames(exc)))
    return failure_record(exc, now, text, traceback.extract_tb(root_cause(exc).__traceback__))


def failure_record(
    exc: BaseException, now: float, text: str, root_frames: Sequence[traceback.FrameSummary]
) -> FailureRecord:
    """:func:`failure_from_exception`, given the traceback's text and the frames of the root
    cause: the crash guard's caller gets an exception from its child as data
    (:mod:`poisonq.worker.raised`), formats those itself, and records it here, so that a
    failure is recorded the same under the guard as outside it."""
    root = root_cause(exc)
    message = str(root) if root is exc else f"{root} → {_raised(exc, root)}"
    return FailureRecord(
        time=now,
        error_type=type_name(root),
        message=_storable(message)[:MAX_MESSAGE],
        traceback=tail(_storable(text), MAX_TRACEBACK),
        fingerprint=_fingerprint(root, root_frames),
    )


def _raised(exc: BaseException, root: BaseException) -> str:
    """The type and line of the exception raised over ``root``, the root's text said once:
    ``raise PermanentError(str(error)) from error`` repeats it whole (told as the type
    alone), ``f"bad order: {error}"`` within its own (an ellipsis in its place)."""
    line, said = first_line(exc), first_line(root) if str(root).strip() else ""
    if said and said in line:
        line = line.replace(said, "…").strip()
    return type(exc).__name__ if line in ("…", "") else f"{type(exc).__name__}: {line}"


def _storable(text: str) -> str:
    """``text`` with what no store can keep spelled out: a NUL as ``\\x00`` (PostgreSQL has
    no NUL in text) and a lone surrogate as ``\\udcff`` (not Unicode; a file name that was
    not UTF-8 carries them). An exception's text is whatever the failing code put there, and
    its failure must be recorded all the same."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode()


def describe(failure: FailureRecord) -> str:
    """The one-line description a dead-lettered message carries for its last failure."""
    return f"{failure.error_type}: {failure.message}"[:MAX_MESSAGE]


def dead_lettering(seq: int, lock_token: str, failure: FailureRecord) -> DeadLetter:
    """The dead-lettering of a message for ``failure``, the same on every path (the
    Processor, the pipeline's workers, a Spark UDF): the reason is the root-cause exception's
    class name (as the failure records it, so a worker that only has the record can tell it),
    the description its one line (:func:`describe`); the traceback stays in the failure."""
    reason = failure.error_type.rsplit(".", 1)[-1]
    return DeadLetter(seq, lock_token, reason, describe(failure), failure)
