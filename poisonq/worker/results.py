"""What one row through a transform gives: its output, or its failure as data.

Shared by the caller and the children of the crash guard (:mod:`poisonq.worker.guard`), so
kept to what a child needs: a child's imports are in every fork. The failures module is
imported where a failure is recorded, not here: it loads :mod:`poisonq.model`, and with it
``threading``, whose fork handler would run in every child (a child records a failure only
in the rare case :mod:`poisonq.worker.raised` cannot take it down as data).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poisonq.errors import PermanentError

if TYPE_CHECKING:
    from poisonq.model import FailureRecord

Transform = Callable[[dict[str, Any]], dict[str, Any] | None]
RowTransform = Callable[[Any], dict[str, Any] | None]  # what the guard runs: any row type


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


def failed(exc: Exception, permanent: tuple[type[BaseException], ...]) -> Failed:
    """A transform's exception as data: a :class:`PermanentError`, or one of the
    ``permanent`` types, is permanent."""
    from poisonq.failures import failure_from_exception

    is_permanent = isinstance(exc, (PermanentError, *permanent))
    return Failed(failure_from_exception(exc, time.time()), is_permanent)


def apply(
    transform: RowTransform,
    row: Any,
    permanent: tuple[type[BaseException], ...],
    record: Callable[[Exception, tuple[type[BaseException], ...]], Any] = failed,
) -> Any:
    """One row through the transform: its output, or its exception as :class:`Failed`
    (``record`` makes it: the crash guard's child takes it down as data instead, for the
    caller to record, :mod:`poisonq.worker.raised`)."""
    try:
        return transform(row)
    except Exception as exc:  # the one place where a transform's failure is caught
        return record(exc, permanent)
