"""What a Processor's handler run comes to for each message, and the settlement each calls for.

The names say what becomes of the message, not what the retry policy or the poison action
will make of it later: a permanent failure is dead-lettered now (whatever the queue's
``receive_error_handling``), a transient one is abandoned and the queue's retry policy
decides whether it comes back, and a message given back is released with no delivery
counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from poisonq.failures import dead_lettering
from poisonq.model import Abandon, Complete, FailureRecord, ReceivedMessage, Release, Settlement


@dataclass(frozen=True)
class HandlerFailure:
    """A handler's failure as data: the exception (what ``on_poison`` is given), its record
    (what the store keeps), and whether it is permanent (a :class:`PermanentError` or one of
    the Processor's ``permanent`` types)."""

    error: BaseException
    record: FailureRecord
    permanent: bool


@dataclass(frozen=True)
class Succeeded:
    """The handler returned: complete the message."""

    message: ReceivedMessage


@dataclass(frozen=True)
class FailedTransiently:
    """The handler raised (or its process died): abandon, and the retry policy decides."""

    message: ReceivedMessage
    failure: HandlerFailure


@dataclass(frozen=True)
class FailedPermanently:
    """The handler raised a permanent error: dead-letter now, with its type as reason."""

    message: ReceivedMessage
    failure: HandlerFailure


@dataclass(frozen=True)
class GivenBack:
    """Released without a delivery counted: not handled (a message before it in its session
    failed, its lock was lost, or it waits to run alone as a suspect), or handled and failed
    by a defect."""

    message: ReceivedMessage


Outcome = Succeeded | FailedTransiently | FailedPermanently | GivenBack


def outcome_of(message: ReceivedMessage, failure: HandlerFailure | None) -> Outcome:
    """A handled message's outcome from its handler run's failure (``None``: it passed)."""
    if failure is None:
        return Succeeded(message)
    if failure.permanent:
        return FailedPermanently(message, failure)
    return FailedTransiently(message, failure)


def failure_record(outcome: Outcome) -> FailureRecord | None:
    """What the outcome tells the defect window: its failure, or ``None`` for a success."""
    match outcome:
        case FailedTransiently(_, failure) | FailedPermanently(_, failure):
            return failure.record
        case _:
            return None


def first_delivery(outcome: Outcome) -> bool:
    """A handled message on its first delivery (a message given back may not have run)."""
    return not isinstance(outcome, GivenBack) and outcome.message.delivery_count == 1


def settlement(outcome: Outcome) -> Settlement:
    token = outcome.message.lock_token
    seq = outcome.message.sequence_number
    assert token is not None, "the processor receives in peek-lock mode"
    match outcome:
        case Succeeded():
            return Complete(seq, token)
        case GivenBack():
            return Release(seq, token)
        case FailedPermanently(_, failure):
            return dead_lettering(seq, token, failure.record)
        case FailedTransiently(_, failure):
            return Abandon(seq, token, failure.record)
