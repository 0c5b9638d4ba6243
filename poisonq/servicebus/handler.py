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
from typing import Any

from poisonq.errors import PoisonqError
from poisonq.lock_renewer import AutoLockRenewer
from poisonq.model import ReceivedMessage
from poisonq.servicebus.exceptions import AutoLockRenewFailed, ServiceBusError, translate

SHUTDOWN = (
    "The handler has already been shutdown. Please use ServiceBusClient to create a new instance."
)
RENEWER_SHUTDOWN = (
    "The AutoLockRenewer has already been shutdown. Please create a new instance for auto lock"
    " renewing."
)


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
