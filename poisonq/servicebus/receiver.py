"""``ServiceBusReceiver`` and ``ServiceBusSession``: azure-servicebus 7's receiver on
poisonq's :class:`~poisonq.Receiver` and, for a session, :class:`~poisonq.SessionReceiver`.

A session receiver accepts its session when it is opened (its ``with`` block, or its first
call): a named one at once (:class:`SessionCannotBeLockedError` if another receiver holds
it), :data:`NEXT_AVAILABLE_SESSION` waiting up to ``max_wait_time`` for one
(:class:`OperationTimeoutError` if none comes). Closing it gives the session up with what
it still holds, counting no delivery.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from poisonq.model import ReceivedMessage
from poisonq.receivers import RECEIVE_WAIT, Receiver, SessionReceiver
from poisonq.servicebus.connection import receive_count
from poisonq.servicebus.constants import (
    ServiceBusSessionFilter,
)
from poisonq.servicebus.exceptions import (
    OperationTimeoutError,
    translated,
)
from poisonq.servicebus.handler import BrokerSource, Handler, ReceiverHandler, Renewing
from poisonq.servicebus.message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from poisonq.client import Broker


class ServiceBusSession:
    """The session a session receiver holds: its id, lock and state."""

    def __init__(self, receiver: SessionReceiver, owner: Handler) -> None:
        self._native = receiver
        self._owner = owner  # the SDK receiver: its close ends this session's calls
        self.auto_renew_error: BaseException | None = None

    @property
    def session_id(self) -> str:
        return self._native.session_id

    @property
    def locked_until_utc(self) -> datetime.datetime | None:
        return self._native.session_locked_until

    def get_state(self, **kwargs: Any) -> bytes | None:
        self._owner._check_live()
        with translated():
            return self._native.get_session_state()

    def set_state(self, state: str | bytes | bytearray | None, **kwargs: Any) -> None:
        self._owner._check_live()
        with translated():
            self._native.set_session_state(bytes(state) if isinstance(state, bytearray) else state)

    def renew_lock(self, **kwargs: Any) -> datetime.datetime:
        """Extend the session lock (and the locks of the messages received under it)."""
        self._owner._check_live()
        with translated():
            self._native.renew_session_lock()
        assert self._native.session_locked_until is not None
        return self._native.session_locked_until


class ServiceBusReceiver(ReceiverHandler):
    """Receives from a queue, a subscription or one of their subqueues, and settles."""

    _client: BrokerSource[Broker]
    _auto_lock_renewer: Renewing | None
    _native: Receiver | None
    _session: ServiceBusSession | None

    @property
    def session(self) -> ServiceBusSession:
        """The session this receiver holds (accepting it, if not yet)."""
        if self._session_id is None:
            raise TypeError("session is only available to receivers of a session_id")
        self._open()
        assert self._session is not None
        return self._session

    def _open(self) -> Receiver:
        self._check_live()
        if self._native is not None:
            return self._native
        broker = self._client.broker()
        with translated():
            if self._session_id is None:
                self._native = broker.receiver(
                    self.entity_path, subqueue=self._sub_queue, receive_mode=self._receive_mode
                )
            else:
                native = self._accept(broker)
                self._native, self._session = native, ServiceBusSession(native, self)
                if self._auto_lock_renewer is not None:
                    self._auto_lock_renewer.register(self, self._session)
        return self._native

    def _accept(self, broker: Broker) -> SessionReceiver:
        if isinstance(self._session_id, ServiceBusSessionFilter):
            wait = self._max_wait_time or RECEIVE_WAIT
            got: SessionReceiver | None = broker.accept_next_session(
                self.entity_path, max_wait=wait
            )
            if got is None:
                raise OperationTimeoutError(
                    message=f"no session of {self.entity_path!r} became available in {wait:g} s"
                )
            return got
        assert self._session_id is not None  # a plain receiver accepts no session
        return broker.accept_session(self.entity_path, self._session_id)

    def close(self) -> None:
        """Close for good: a session receiver gives its session up with what it still holds;
        the locks registered with a renewer are no longer renewed; every call after raises
        the SDK's ``ValueError``."""
        if self._shutdown:
            return
        self._shut_down()
        if isinstance(self._native, SessionReceiver):
            with translated():
                self._native.close()

    def __enter__(self) -> ServiceBusReceiver:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Receiving ----------------------------------------------------------------------------
    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages, waiting up to ``max_wait_time`` (else the
        receiver's) for the first; with neither, until one comes, as the SDK does."""
        count = receive_count(max_message_count, max_wait_time)
        wait = max_wait_time or self._max_wait_time
        native = self._open()
        with translated():
            got = native.receive(max_messages=count, max_wait=wait or RECEIVE_WAIT)
            while not got and wait is None:
                got = native.receive(max_messages=count, max_wait=RECEIVE_WAIT)
        return self._wrap(got)

    def __iter__(self) -> Iterator[ServiceBusReceivedMessage]:
        return self

    def __next__(self) -> ServiceBusReceivedMessage:
        """The next message; the iteration ends once none came for ``max_wait_time``
        (never without it)."""
        while True:
            native = self._open()
            with translated():
                got = native.receive(max_messages=1, max_wait=self._max_wait_time or RECEIVE_WAIT)
            if got:
                return self._wrap(got)[0]
            if self._max_wait_time is not None:
                raise StopIteration

    def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        """Lock deferred messages by sequence number (all, or none and
        :class:`MessageNotFoundError`)."""
        native = self._open()
        with translated():
            got = native.receive_deferred(sequence_numbers)
        return self._wrap(got)

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, **kwargs: Any
    ) -> list[ServiceBusReceivedMessage]:
        """Messages from ``sequence_number`` on, without locking them or counting a
        delivery (a session receiver's: its session's)."""
        receive_count(max_message_count, None)
        native = self._open()
        broker = self._client.broker()
        with translated():
            where = {} if self._session is None else {"session_id": self._session.session_id}
            got = broker.peek(
                native.address,
                from_sequence=sequence_number,
                max_messages=max_message_count,
                **where,
            )
        return [ServiceBusReceivedMessage(raw, native.address, peeked=True) for raw in got]

    # Settling -----------------------------------------------------------------------------
    def _checked(self, message: object, action: str) -> tuple[Receiver, ReceivedMessage]:
        """The native receiver and message of a settlement, after the SDK's checks."""
        self._check_settlement(message, action)
        assert isinstance(message, ServiceBusReceivedMessage) and self._native is not None
        return self._native, message.raw

    def _settle(
        self,
        message: ServiceBusReceivedMessage,
        action: str,
        settle: Callable[[Receiver, ReceivedMessage], object],
    ) -> None:
        native, raw = self._checked(message, action)
        with translated():
            settle(native, raw)

    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle(message, "complete", Receiver.complete)

    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        """Back to the queue, a delivery counted (dead-lettered once it used the queue's
        ``max_delivery_count``)."""
        self._settle(message, "abandon", Receiver.abandon)

    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle(message, "defer", Receiver.defer)

    def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        """To the dead-letter queue with ``reason`` and ``error_description`` (without a
        reason, poisonq records ``DeadLetteredByReceiver``)."""
        self._settle(
            message,
            "dead-letter",
            lambda native, raw: native.dead_letter(raw, reason, error_description),
        )

    def renew_message_lock(
        self, message: ServiceBusReceivedMessage, **kwargs: Any
    ) -> datetime.datetime:
        """Extend the message's lock; returns its new ``locked_until_utc``."""
        self._check_live()
        if self._session_id is not None:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions."
                " Please renew the session lock instead."
            )
        native, raw = self._checked(message, "renew lock on")
        with translated():
            native.renew_lock(raw)
        assert message.locked_until_utc is not None
        return message.locked_until_utc
