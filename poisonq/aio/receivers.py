"""The asyncio senders and receivers: each holds the sync one (:mod:`poisonq.receivers`) and
runs its calls off the event loop, so settling, locks and errors are the sync API's; what
they add is waiting in the loop, and giving back what a cancelled receive locked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any

from poisonq.aio.calls import AsyncLink
from poisonq.model import (
    Duration,
    FailureRecord,
    Message,
    ReceivedMessage,
    Settlement,
    to_seconds,
)
from poisonq.receivers import (
    RECEIVE_WAIT,
    MessageOrList,
    Receiver,
    Sender,
    SessionReceiver,
    Settling,
)


class AsyncSender:
    """Sends to one queue: :class:`poisonq.Sender`'s calls as coroutines."""

    def __init__(self, link: AsyncLink, sender: Sender) -> None:
        self.sync = sender
        self._calls = link.calls

    async def send(self, messages: Message | Iterable[Message]) -> list[int]:
        """One message or a batch, in one transaction; the sequence numbers."""
        return await self._calls.run(self.sync._send, messages)

    async def schedule(self, messages: Message | Iterable[Message], at: Any) -> list[int]:
        return await self._calls.run(self.sync._schedule, messages, at)

    async def cancel_scheduled(self, sequence_numbers: int | Sequence[int]) -> int:
        return await self._calls.run(self.sync._cancel_scheduled, sequence_numbers)

    async def close(self) -> None:
        """As :meth:`poisonq.Sender.close`: every later call is refused
        (:class:`~poisonq.InvalidOperationError`); closing again does nothing."""
        self.sync.close()  # a flag: no store call to wait for

    async def __aenter__(self) -> AsyncSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReceiver:
    """Receives from one queue or subqueue and settles: :class:`poisonq.Receiver`'s calls as
    coroutines. ``async for message in receiver`` receives one at a time as they arrive,
    until none has come for ``max_wait_time`` (forever without it).

    A receive cancelled while it waits holds nothing; one cancelled while its look runs
    waits for the look and gives back, uncounted, what it locked (a receive-and-delete
    receive cannot give back what it deleted)."""

    def __init__(self, link: AsyncLink, receiver: Receiver) -> None:
        self.sync = receiver
        self.link = link
        self._calls = link.calls

    @property
    def address(self) -> str:
        return self.sync.address

    async def close(self) -> None:
        """As :meth:`poisonq.Receiver.close`: every later call is refused
        (:class:`~poisonq.InvalidOperationError`), and the messages it holds stay locked
        until they are settled or their locks run out (each then comes again, counted).
        Closing again does nothing."""
        self.sync.close()  # a flag: no store call to wait for

    async def __aenter__(self) -> AsyncReceiver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        wait = self.sync.max_wait_time
        while True:
            got = await self.receive(max_messages=1, max_wait=wait or RECEIVE_WAIT)
            if got:
                yield got[0]
            elif wait is not None:
                return

    async def receive(
        self, max_messages: int = 1, max_wait: Duration | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, oldest first; with ``max_wait``, wait in the event
        loop up to that long for the first to arrive (as :meth:`poisonq.Receiver.receive`)."""
        wait = 0.0 if max_wait is None else to_seconds(max_wait, "max_wait")
        deadline = asyncio.get_running_loop().time() + wait
        return await self.link.changes.look_until(deadline, lambda: self._look(max_messages))

    def _look(
        self, max_messages: int, first: Settling | None = None
    ) -> Awaitable[list[ReceivedMessage]]:
        """One look, settling ``first`` (see :meth:`poisonq.Receiver._completing`), that
        gives back what it took if its caller is cancelled while it runs."""
        complete, settle, settled = first or ([], [], [])
        return self._calls.taking(
            lambda: self.sync._look(max_messages, complete, settle, settled),
            self.sync._give_back,
        )

    async def complete_and_receive(
        self, messages: MessageOrList, max_messages: int = 1
    ) -> list[ReceivedMessage]:
        """Complete ``messages`` and receive the next ones in one transaction."""
        return await self._look(max_messages, self.sync._completing(messages))

    async def settle_and_receive(
        self, settlements: Sequence[Settlement], max_messages: int = 1
    ) -> list[ReceivedMessage]:
        """Settle each its own way and receive the next ones in one transaction."""
        return await self._look(max_messages, self.sync._settling(settlements))

    async def receive_deferred(
        self, sequence_numbers: int | Sequence[int]
    ) -> list[ReceivedMessage]:
        return await self._calls.taking(
            lambda: self.sync._receive_deferred(sequence_numbers), self.sync._give_back
        )

    async def peek(self, max_messages: int = 1, from_sequence: int = 0) -> list[ReceivedMessage]:
        return await self._calls.run(self.sync._peek, max_messages, from_sequence)

    async def complete(self, messages: MessageOrList) -> None:
        """locked → completed."""
        await self._calls.run(self.sync._complete, messages)

    async def abandon(
        self,
        messages: MessageOrList,
        error: BaseException | FailureRecord | None = None,
        delay: Duration | None = None,
    ) -> list[int]:
        """locked → active again, or poisoned; as :meth:`poisonq.Receiver.abandon`."""
        return await self._calls.run(self.sync._abandon, messages, error, delay)

    async def defer(self, messages: MessageOrList) -> None:
        await self._calls.run(self.sync._defer, messages)

    async def dead_letter(
        self,
        messages: MessageOrList,
        reason: str | None = None,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> None:
        await self._calls.run(self.sync._dead_letter, messages, reason, description, error)

    async def effective_lock_duration(self) -> float:
        """The lock duration this receiver's locks get (its own, else the queue's)."""
        return await self._calls.run(self.sync._effective_lock_duration)

    async def renew_lock(self, messages: MessageOrList) -> None:
        await self._calls.run(self.sync._renew_lock, messages)


class AsyncSessionReceiver(AsyncReceiver):
    """The messages of one session, in order, under its lock: :class:`poisonq.SessionReceiver`
    as coroutines. Leaving the ``async with`` block closes it as the sync ``with`` does (an
    exception counts a delivery against the message in hand). A cancelled receive leaves
    what it locked under the session lock, which the close gives back uncounted."""

    sync: SessionReceiver

    @property
    def session_id(self) -> str:
        return self.sync.session_id

    @property
    def closed(self) -> bool:
        return self.sync.closed

    async def __aenter__(self) -> AsyncSessionReceiver:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._calls.run(self.sync._exit, exc[1] if len(exc) > 1 else None)

    async def get_session_state(self) -> bytes | None:
        return await self._calls.run(self.sync._get_session_state)

    async def set_session_state(self, state: bytes | str | None) -> None:
        await self._calls.run(self.sync._set_session_state, state)

    async def renew_session_lock(self) -> None:
        await self._calls.run(self.sync._renew_session_lock)

    async def dead_letter_session(
        self,
        reason: str,
        description: str | None = None,
        error: BaseException | FailureRecord | None = None,
    ) -> list[int]:
        return await self._calls.run(self.sync._dead_letter_session, reason, description, error)

    async def close(self) -> None:
        await self._calls.run(self.sync._close, None)
