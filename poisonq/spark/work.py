"""What the two kinds of function of messages (``map=``, ``map_batches=``) share on the
executors: the options they run with, and how a message they failed is settled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from poisonq.failures import dead_lettering
from poisonq.model import Abandon
from poisonq.spark.rows import OutputSchema
from poisonq.spark.settling import Failure
from poisonq.worker.guard import CRASHED, Crashed, Failed


@dataclass(frozen=True)
class FunctionWork:
    """The options a pipeline's function of messages runs with (picklable)."""

    output: OutputSchema
    permanent: tuple[type[BaseException], ...]
    isolate: bool
    max_failure_ratio: float | None


def settlement(seq: int, lock_token: str, result: Failed | Crashed) -> Failure:
    """A failed message's settlement: dead-lettered if its failure is permanent, else
    abandoned, so the queue's retry policy applies (a crash is never permanent)."""
    if type(result) is Failed and result.permanent:
        return dead_lettering(seq, lock_token, result.failure)
    return Abandon(seq, lock_token, result.failure)


def crashed(failure: Failure) -> TypeGuard[Abandon]:
    """Whether a failed message's settlement is that of a crash (the worker died in it)."""
    record = failure.failure
    return type(failure) is Abandon and record is not None and record.error_type == CRASHED


def function_name(function: Any) -> str:
    """How a warning or an error names the user's function: its qualified name."""
    return getattr(function, "__qualname__", None) or repr(function)
