"""azure-servicebus 7's ``aio`` receiver and session on :mod:`poisonq.aio`: the sync
flavour's rules (:mod:`poisonq.servicebus.connection`, ``message``, ``exceptions``) with
coroutines. A session receiver accepts its session as its ``async with`` block opens (or on
its first call), as the SDK's does."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from poisonq.aio import AsyncBroker, AsyncReceiver, AsyncSessionReceiver
from poisonq.receivers import RECEIVE_WAIT
from poisonq.servicebus.connection import receive_count
from poisonq.servicebus.constants import (
    ServiceBusSessionFilter,
)
from poisonq.servicebus.exceptions import OperationTimeoutError, translated
from poisonq.servicebus.handler import BrokerSource, ReceiverHandler, Renewing
from poisonq.servicebus.message import ServiceBusReceivedMessage


class ServiceBusSession:
    """The session an ``aio`` session receiver holds: its id, lock and state. Its calls open
    the receiver (accepting the session) if it is not open yet, as the SDK's do."""

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self._receiver = receiver
        self._native: AsyncSessionReceiver | None = None  # set as the receiver accepts it
        self.auto_renew_error: BaseException | None = None

    @property
    def session_id(self) -> str | None:
        """The session's id; for ``NEXT_AVAILABLE_SESSION``, ``None`` until it is accepted."""
        if self._native is not None:
            return self._native.session_id
        named = self._receiver._session_id
        return named if isinstance(named, str) else None

    @property
    def locked_until_utc(self) -> datetime.datetime | None:
        return None if self._native is None else self._native.sync.session_locked_until

    async def _accepted(self) -> AsyncSessionReceiver:
        await self._receiver._open()  # refuses a closed receiver
        assert self._native is not None
        return self._native

    async def get_state(self, **kwargs: Any) -> bytes | None:
        native = await self._accepted()
        with translated():
            return await native.get_session_state()

    async def set_state(self, state: str | bytes | bytearray | None, **kwargs: Any) -> None:
        native = await self._accepted()
        with translated():
            await native.set_session_state(bytes(state) if isinstance(state, bytearray) else state)

    async def renew_lock(self, **kwargs: Any) -> datetime.datetime:
        """Extend the session lock (and the locks of the messages received under it)."""
        native = await self._accepted()
        with translated():
            await native.renew_session_lock()
        assert self.locked_until_utc is not None
        return self.locked_until_utc


class ServiceBusReceiver(ReceiverHandler):
    """Receives from a queue, a subscription or one of their subqueues, and settles."""

    _client: BrokerSource[Awaitable[AsyncBroker]]
    _auto_lock_renewer: Renewing | None
    _native: AsyncReceiver | None
    _session: ServiceBusSession | None

    def _unopened_session(self) -> ServiceBusSession | None:
        """A session receiver's session object from the start: its calls open the receiver."""
        return None if self._session_id is None else ServiceBusSession(self)

    @property
    def session(self) -> ServiceBusSession:
        """The session this receiver holds, or will hold once it opens."""
        if self._session is None:
            raise TypeError("session is only available to receivers of a session_id")
        return self._session

    async def _open(self) -> AsyncReceiver:
        self._check_live()
        if self._native is not None:
            return self._native
        broker = await self._client.broker()
        with translated():
            if self._session_id is None:
                self._native = broker.receiver(
                    self.entity_path, subqueue=self._sub_queue, receive_mode=self._receive_mode
                )
            else:
                native = await self._accept(broker)
                assert self._session is not None
                self._native = self._session._native = native
                if self._auto_lock_renewer is not None:
                    self._auto_lock_renewer.register(self, self._session)
        return self._native

    async def _accept(self, broker: AsyncBroker) -> AsyncSessionReceiver:
        if isinstance(self._session_id, ServiceBusSessionFilter):
            wait = self._max_wait_time or RECEIVE_WAIT
            got = await broker.accept_next_session(self.entity_path, max_wait=wait)
            if got is None:
                raise OperationTimeoutError(
                    message=f"no session of {self.entity_path!r} became available in {wait:g} s"
                )
            return got
        assert self._session_id is not None
        return await broker.accept_session(self.entity_path, self._session_id)

    async def close(self) -> None:
        """Close for good: a session receiver gives its session up with what it still holds;
        the locks registered with a renewer are no longer renewed; every call after raises
        the SDK's ``ValueError``."""
        if self._shutdown:
            return
        self._shut_down()
        if isinstance(self._native, AsyncSessionReceiver):
            with translated():
                await self._native.close()

    async def __aenter__(self) -> ServiceBusReceiver:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Receiving ----------------------------------------------------------------------------
    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages, waiting up to ``max_wait_time`` (else the
        receiver's) for the first; with neither, until one comes, as the SDK does."""
        count = receive_count(max_message_count, max_wait_time)
        wait = max_wait_time or self._max_wait_time
        native = await self._open()
        with translated():
            got = await native.receive(max_messages=count, max_wait=wait or RECEIVE_WAIT)
            while not got and wait is None:
                got = await native.receive(max_messages=count, max_wait=RECEIVE_WAIT)
        return self._wrap(got)

    def __aiter__(self) -> ServiceBusReceiver:
        return self

    async def __anext__(self) -> ServiceBusReceivedMessage:
        """The next message as it comes; the iteration ends once none came for
        ``max_wait_time`` (never without it)."""
        while True:
            native = await self._open()
            with translated():
                got = await native.receive(1, self._max_wait_time or RECEIVE_WAIT)
            if got:
                return self._wrap(got)[0]
            if self._max_wait_time is not None:
                raise StopAsyncIteration

    async def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        native = await self._open()
        with translated():
            got = await native.receive_deferred(sequence_numbers)
        return self._wrap(got)

    async def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        """Messages from ``sequence_number`` on, without locking them (a session receiver's:
        its session's)."""
        receive_count(max_message_count, None)
        native = await self._open()
        broker = await self._client.broker()
        where = {} if self._session is None else {"session_id": self._session.session_id}
        with translated():
            got = await broker.peek(
                native.address,
                from_sequence=sequence_number,
                max_messages=max_message_count,
                **where,
            )
        return [ServiceBusReceivedMessage(raw, native.address, peeked=True) for raw in got]

    # Settling -----------------------------------------------------------------------------
    def _checked(self, message: ServiceBusReceivedMessage, action: str) -> AsyncReceiver:
        """The native receiver of a settlement, after the SDK's checks."""
        self._check_settlement(message, action)
        assert self._native is not None
        return self._native

    async def _settle(
        self,
        message: ServiceBusReceivedMessage,
        action: str,
        settle: Callable[[AsyncReceiver, Any], Awaitable[object]],
    ) -> None:
        native = self._checked(message, action)
        with translated():
            await settle(native, message.raw)

    async def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "complete", AsyncReceiver.complete)

    async def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "abandon", AsyncReceiver.abandon)

    async def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settle(message, "defer", AsyncReceiver.defer)

    async def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        await self._settle(
            message,
            "dead-letter",
            lambda native, raw: native.dead_letter(raw, reason, error_description),
        )

    async def renew_message_lock(
        self, message: ServiceBusReceivedMessage, **kwargs: Any
    ) -> datetime.datetime:
        """Extend the message's lock; returns its new ``locked_until_utc``."""
        self._check_live()
        if self._session_id is not None:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions."
                " Please renew the session lock instead."
            )
        native = self._checked(message, "renew lock on")
        with translated():
            await native.renew_lock(message.raw)
        assert message.locked_until_utc is not None
        return message.locked_until_utc
