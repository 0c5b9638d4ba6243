"""The locks a Processor lost before it settled their messages, each reported once.

A lock is lost when its renewal fails, or stops at ``max_lock_renewal_duration`` while the
handler still runs; the renewer may see it first, or the settlement that finds it gone. Both
Processors report it the same way: a warning, and ``on_lock_lost(message)`` once per message
and lock. The message is delivered again; a message handler does not run on one whose lock
is known lost.

Unless that delivery was its last: the expiry of the lock then poisons it, in whichever
transaction counts the expiry first (a receive's or a read's housekeeping, in any process),
so no settlement of the run hears of it. :func:`poisoned_by_expiry` finds such messages
afterwards by reading the dead-letter queue (a read counts what is due first).

A hook that raises (or whose coroutine does) is logged with its traceback, naming the hook
and the message, and the run goes on: a lost lock is news, and the message comes again
whatever the hook does (unlike ``on_poison``, whose error ends the run: a poisoned message
is reported there only).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from poisonq.errors import MessageLockLostError, MessageNotFoundError
from poisonq.model import DeadLetterReason, ReceivedMessage, SubQueue
from poisonq.names import parse_address, subqueue_name

log = logging.getLogger(__name__)

LockLostHook = Callable[[ReceivedMessage], Any]


class LostLocks:
    """What one Processor run knows lost; ``report`` and ``known`` may be called from any
    thread (the renewer's passes run in one of their own)."""

    def __init__(self, address: str, hook: LockLostHook | None, awaits: bool = True) -> None:
        self._address = address
        self._hook = hook
        self._awaits = awaits  # whether the caller awaits what report returns (asyncio)
        self._lost: set[tuple[int, str]] = set()
        self._guard = threading.Lock()

    def report(self, message: ReceivedMessage) -> Any:
        """Log a lost lock and call the hook, the first time for this message and lock;
        ``None``, or a coroutine to await when the hook returned an awaitable (the asyncio
        Processor awaits it). Neither this nor that coroutine raises what the hook raised:
        it is logged."""
        key = (message.sequence_number, message.lock_token or "")
        with self._guard:
            if key in self._lost:
                return None
            self._lost.add(key)
        log.warning(
            "lost the lock on message %d of %s: it was not settled and will be delivered again",
            message.sequence_number,
            self._address,
        )
        if self._hook is None:
            return None
        try:
            result = self._hook(message)
        except Exception:  # advisory: logged, and the run goes on
            self._log_raised(message)
            return None
        if not inspect.isawaitable(result):
            return None
        if self._awaits:
            return self._awaited(result, message)
        if inspect.iscoroutine(result):
            result.close()  # never to run: closed, so Python does not warn it was not awaited
        log.error(
            "the on_lock_lost hook %r returned %r for message %d of %s, which poisonq.Processor"
            " does not await: use poisonq.aio.Processor",
            self._hook,
            result,
            message.sequence_number,
            self._address,
        )
        return None

    async def _awaited(self, result: Awaitable[Any], message: ReceivedMessage) -> None:
        try:
            await result
        except Exception:  # advisory: logged, and the run goes on
            self._log_raised(message)

    def _log_raised(self, message: ReceivedMessage) -> None:
        log.exception(
            "the on_lock_lost hook %r raised for message %d of %s (the run goes on)",
            self._hook,
            message.sequence_number,
            self._address,
        )

    def known(self, message: ReceivedMessage) -> bool:
        with self._guard:
            return (message.sequence_number, message.lock_token or "") in self._lost


class MessageReader(Protocol):
    """What :func:`poisoned_by_expiry` reads with (the :class:`~poisonq.Broker` is one)."""

    def message(self, address: str, sequence_number: int) -> ReceivedMessage: ...


def poisoned_by_expiry(
    broker: MessageReader, address: str, lost: Sequence[ReceivedMessage]
) -> list[tuple[ReceivedMessage, BaseException]]:
    """The messages of ``lost`` (their locks ran out before the run settled them) that the
    expiry of that very lock poisoned into ``address``'s dead-letter queue, each with the
    error ``on_poison`` is given for it (its lock's loss): there with
    ``MaxDeliveryCountExceeded``, no delivery since this one, and one failure more, the
    lock's expiry. A poison action other than ``move`` (drop, reject, fault) leaves nothing
    to find there, and a receiver of a subqueue has no dead-letter queue of its own."""
    if not lost:
        return []
    where = parse_address(address)
    if where.subqueue is not None:
        return []
    dead_letters = subqueue_name(where.entity, SubQueue.DEADLETTER)
    found: list[tuple[ReceivedMessage, BaseException]] = []
    for message in lost:
        try:
            letter = broker.message(dead_letters, message.sequence_number)
        except MessageNotFoundError:
            continue
        if (
            letter.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
            and letter.delivery_count == message.delivery_count
            and len(letter.failures) == len(message.failures) + 1
            and letter.last_lock_expired
        ):
            found.append((message, MessageLockLostError([message.sequence_number])))
    return found
