"""What the SDK's senders and receivers share, sync and asyncio: a handler's life.

Once closed (by itself, or by the client that handed it out), a handler refuses every call
with the SDK's ``ValueError``, as azure-servicebus' ``_check_live`` does: nothing reopens it,
so a closed receiver never locks a message that nobody will settle. Closing a receiver also
stops the renewal of the locks it registered and did not settle (the SDK's renewer stops
with the receiver), so they run out and the messages come again. The two renewers share
how a registration is refused and how a lost lock is reported (:func:`check_renewer_open`,
:func:`reporting_loss`). No I/O: the asyncio flavour shares this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from poisonq.errors import PoisonqError
from poisonq.lock_renewer import AutoLockRenewer
from poisonq.model import ReceivedMessage, ReceiveMode
from poisonq.servicebus.connection import receiver_options
from poisonq.servicebus.constants import (
    ServiceBusReceiveMode,
    ServiceBusSessionFilter,
    sdk_receive_mode,
)
from poisonq.servicebus.exceptions import AutoLockRenewFailed, ServiceBusError, translate
from poisonq.servicebus.message import ServiceBusReceivedMessage, check_settleable

SHUTDOWN = (
    "The handler has already been shutdown. Please use ServiceBusClient to create a new instance."
)
RENEWER_SHUTDOWN = (
    "The AutoLockRenewer has already been shutdown. Please create a new instance for auto lock"
    " renewing."
)

B_co = TypeVar("B_co", covariant=True)


class BrokerSource(Protocol[B_co]):
    """What a sender or a receiver uses of the client that made it: the poisonq broker
    under it, opened on first use (a ``poisonq.Broker``, or in the ``aio`` flavour an
    awaitable of a ``poisonq.aio.AsyncBroker``)."""

    def broker(self) -> B_co: ...


class Renewing(Protocol):
    """What a receiver uses of its ``auto_lock_renewer``: registering what it receives (a
    message, or the session it accepted) with it."""

    def register(self, receiver: Any, renewable: Any) -> None: ...


class Handler:
    """A sender or a receiver: open until :meth:`_shut_down`, refusing every call after."""

    def __init__(self) -> None:
        self._shutdown = False
        # The messages this receiver's registrations renew: (the renewer that renews them,
        # the message), forgotten by the renewer when the receiver closes.
        self._renewals: list[tuple[AutoLockRenewer, ReceivedMessage]] = []

    def _check_live(self) -> None:
        """Raise the SDK's ``ValueError`` if this handler was closed."""
        if self._shutdown:
            raise ValueError(SHUTDOWN)

    def _renewed_by(self, renewer: AutoLockRenewer, message: ReceivedMessage) -> None:
        """``renewer`` renews ``message``'s lock for this receiver, until it closes. What
        was settled since is forgotten here, so a receiver that lives long holds only the
        messages it has in hand."""
        self._renewals = [(r, m) for r, m in self._renewals if not m.settled]
        self._renewals.append((renewer, message))

    def _shut_down(self) -> None:
        """Refuse every call from now on, and stop renewing what this receiver holds."""
        self._shutdown = True
        for renewer, message in self._renewals:
            renewer.unregister(message)
        self._renewals.clear()


class ReceiverHandler(Handler):
    """A receiver and its options, checked as the SDK checks them: what both flavours'
    ``ServiceBusReceiver`` are given by their client. ``_native`` is the poisonq receiver
    (or session receiver) once opened; ``_session`` what :meth:`_unopened_session` gives
    until then."""

    def __init__(
        self,
        client: Any,
        entity_path: str,
        *,
        session_id: str | ServiceBusSessionFilter | None,
        sub_queue: str | None,
        receive_mode: ServiceBusReceiveMode | str,
        max_wait_time: float | None,
        auto_lock_renewer: Any,
        prefetch_count: int,
    ) -> None:
        super().__init__()
        self._client = client
        self.entity_path = entity_path
        self._session_id = session_id
        self._sub_queue, self._receive_mode = receiver_options(
            session_id, sub_queue, receive_mode, max_wait_time, prefetch_count
        )
        self._max_wait_time = max_wait_time
        self._auto_lock_renewer = auto_lock_renewer
        self._native: Any = None
        self._session = self._unopened_session()

    def _unopened_session(self) -> Any:
        """The session object before the receiver opens (none: the sync one makes it as it
        accepts the session)."""
        return None

    @property
    def receive_mode(self) -> ServiceBusReceiveMode:
        return sdk_receive_mode(self._receive_mode)

    def _check_settlement(self, message: object, action: str) -> None:
        """The SDK's checks before a settlement: an open receiver, and a message it
        received (not peeked, not received and deleted, not settled already)."""
        self._check_live()
        deleted = self._receive_mode is ReceiveMode.RECEIVE_AND_DELETE
        check_settleable(
            message, action, deleted, None if self._native is None else self._native.address
        )

    def _wrap(self, got: list[ReceivedMessage]) -> list[ServiceBusReceivedMessage]:
        """What the receiver received, as the SDK's messages (a received-and-deleted one
        settled already), each registered with the receiver's renewer if it has one (a
        session's lock is renewed as the session's)."""
        deleted = self._receive_mode is ReceiveMode.RECEIVE_AND_DELETE
        assert self._native is not None  # open: it received them
        source = self._native.address
        messages = [ServiceBusReceivedMessage(raw, source, settled=deleted) for raw in got]
        if self._auto_lock_renewer is not None and self._session is None and not deleted:
            for message in messages:
                self._auto_lock_renewer.register(self, message)
        return messages


def check_renewer_open(renewer: AutoLockRenewer) -> None:
    """A closed renewer refuses a registration with the SDK's ``ServiceBusError``."""
    if renewer.closed:
        raise ServiceBusError(RENEWER_SHUTDOWN)


def reporting_loss(
    renewable: Any, callback: Callable[[Any, BaseException | None], Any] | None
) -> Callable[[object, PoisonqError], Any]:
    """What the native renewer calls when ``renewable``'s lock is lost: the SDK's
    ``AutoLockRenewFailed`` (its ``error`` the lost lock's, translated) set as the
    renewable's ``auto_renew_error`` and given to ``callback`` with the SDK's object, whose
    result (a coroutine, for the asyncio renewer to run) is returned."""

    def lost(_: object, error: PoisonqError) -> Any:
        failure = AutoLockRenewFailed("Failed to auto-renew lock", error=translate(error))
        renewable.auto_renew_error = failure
        return None if callback is None else callback(renewable, failure)

    return lost
