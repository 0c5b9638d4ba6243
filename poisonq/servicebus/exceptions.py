"""The exception types of azure-servicebus 7 (``azure.servicebus.exceptions``), and the one
place poisonq's errors become them (:func:`translated`).

Every type has the SDK's name, base classes and keyword-only constructor (``message=``,
``error=``), so ``except MessageLockLostError`` and ``except ServiceBusError`` catch what
they catch there. The poisonq error a translated one stands for is its ``error`` and its
``__cause__``, with every field poisonq gives (sequence numbers, entity names). No I/O here:
the asyncio flavour shares this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from poisonq import errors


class ServiceBusError(Exception):
    """Base exception of every Service Bus error; ``error`` is the poisonq error behind it
    (also its ``__cause__``), ``message`` its text."""

    def __init__(self, message: str | bytes | None = None, *args: Any, **kwargs: Any) -> None:
        self.error: BaseException | None = kwargs.pop("error", None)
        self._retryable = bool(kwargs.pop("retryable", False))
        if isinstance(message, bytes):
            message = message.decode("utf-8")
        self.message = message or "Service Bus has encountered an error."
        super().__init__(self.message, *args)


def _default(text: str, retryable: bool = False) -> Any:
    """An ``__init__`` taking only keywords, with the SDK's default message."""

    def __init__(self: ServiceBusError, **kwargs: Any) -> None:
        message = kwargs.pop("message", text)
        ServiceBusError.__init__(self, message, retryable=retryable, **kwargs)

    return __init__


class ServiceBusConnectionError(ServiceBusError):
    """An error occurred in the connection (here: the store could not be reached)."""

    __init__ = _default("An error occurred in the connection.", retryable=True)


class ServiceBusAuthenticationError(ServiceBusError):
    """An error occurred when authenticating the connection."""

    __init__ = _default("An error occurred when authenticating the connection.", True)


class ServiceBusAuthorizationError(ServiceBusError):
    """An error occurred when authorizing the connection."""

    __init__ = _default("An error occurred when authorizing the connection.", True)


class OperationTimeoutError(ServiceBusError):
    """Operation timed out (here: no session became available in time)."""

    __init__ = _default("Operation timed out.", retryable=True)


class MessageSizeExceededError(ServiceBusError, ValueError):
    """A message, or a batch, is larger than its limit; nothing was sent."""

    __init__ = _default("Message content is larger than the service bus frame size.")


class MessageAlreadySettled(ValueError):
    """A message was settled (completed, abandoned, dead-lettered or deferred) already; a
    ``ValueError``, not a ``ServiceBusError``, as the SDK's (a check on the client).
    ``error`` is poisonq's :class:`~poisonq.errors.MessageAlreadySettledError`, when it
    stands for one."""

    def __init__(self, **kwargs: Any) -> None:
        action = kwargs.get("action", "operate")
        self.error: BaseException | None = kwargs.get("error")
        super().__init__(
            f"Unable to {action} message; The message has either been deleted or already settled."
        )


class MessageLockLostError(ServiceBusError):
    """The lock on the message is lost: receive and process the message again."""

    __init__ = _default(
        "The lock on the message lock has expired. Callers should call attempt to receive and"
        " process the message again."
    )


class SessionLockLostError(ServiceBusError):
    """The lock on the session has expired: accept the session again."""

    __init__ = _default(
        "The lock on the session has expired. Callers should request the session again."
    )


class MessageNotFoundError(ServiceBusError):
    """The requested message was not found (received, cancelled or settled already)."""

    __init__ = _default("The requested message was not found.")


class MessagingEntityNotFoundError(ServiceBusError):
    """The queue, topic, subscription or rule does not exist."""

    __init__ = _default("A Service Bus resource cannot be found by the Service Bus service.")


class MessagingEntityDisabledError(ServiceBusError):
    """The entity is disabled (for sending, receiving, or both)."""

    __init__ = _default(
        "The Messaging Entity is disabled. Enable the entity again using Portal.", True
    )


class MessagingEntityAlreadyExistsError(ServiceBusError):
    """An entity with the same name exists."""

    __init__ = _default("An entity with the same name exists under the same namespace.")


class ServiceBusQuotaExceededError(ServiceBusError):
    """The entity has reached its maximum size (``max_size_in_megabytes``)."""

    __init__ = _default(
        "The quota applied to a Service Bus resource has been exceeded while interacting with"
        " the Azure Service Bus service."
    )


class ServiceBusServerBusyError(ServiceBusError):
    """The store is busy; try again later."""

    __init__ = _default(
        "The Azure Service Bus service reports that it is busy in response to a client"
        " request to perform an operation.",
        True,
    )


class ServiceBusCommunicationError(ServiceBusError):
    """A general communications error with the store."""

    __init__ = _default(
        "There was a general communications error encountered when interacting with the"
        " Azure Service Bus service.",
        True,
    )


class SessionCannotBeLockedError(ServiceBusError):
    """Another receiver holds the session."""

    __init__ = _default("The requested session cannot be locked.", retryable=True)


class AutoLockRenewFailed(ServiceBusError):
    """A renewal of a message's or a session's lock in the background failed."""


class AutoLockRenewTimeout(ServiceBusError):
    """The time allocated to renew the message or session lock has elapsed."""


class FeatureNotSupportedError(ServiceBusError, NotImplementedError):
    """A Service Bus feature that has no meaning on poisonq (credentials, proxies, AMQP
    annotated messages, geo-replication, ...); ``feature`` names it. Not an SDK type: the
    SDK has no such error, since it has every feature."""

    def __init__(self, feature: str, instead: str | None = None) -> None:
        text = f"poisonq.servicebus does not support {feature}"
        super().__init__(f"{text}: {instead}" if instead else text)
        self.feature = feature


# The poisonq error each SDK type stands for, most specific first (isinstance order).
_TRANSLATIONS: tuple[tuple[type[Exception], type[ServiceBusError]], ...] = (
    (errors.MessageLockLostError, MessageLockLostError),
    (errors.SessionLockLostError, SessionLockLostError),
    (errors.SessionCannotBeLockedError, SessionCannotBeLockedError),
    (errors.MessageNotFoundError, MessageNotFoundError),
    (errors.MessageTooLargeError, MessageSizeExceededError),
    (errors.QuotaExceededError, ServiceBusQuotaExceededError),
    (errors.EntityNotFoundError, MessagingEntityNotFoundError),
    (errors.EntityExistsError, MessagingEntityAlreadyExistsError),
    (errors.EntityDisabledError, MessagingEntityDisabledError),
    (errors.StoreUnavailableError, ServiceBusConnectionError),
    (errors.StoreNotFoundError, ServiceBusConnectionError),
    (errors.StoreFullError, ServiceBusQuotaExceededError),
    (errors.PoisonqError, ServiceBusError),
)


NO_STORE = (
    "is the connection string's path mistyped? A store is made by"
    " ServiceBusAdministrationClient's create_queue, poisonq.connect or poisonq queue create"
)


def translate(error: errors.PoisonqError) -> ServiceBusError | MessageAlreadySettled:
    """The SDK exception for a poisonq error; an argument poisonq refused
    (:class:`~poisonq.errors.InvalidOptionError`, a ``ValueError`` as the SDK raises for
    bad arguments) is not translated."""
    if isinstance(error, errors.MessageAlreadySettledError):
        return MessageAlreadySettled(action="settle", error=error)
    text = str(error)
    if isinstance(error, errors.StoreNotFoundError):
        text += f" ({NO_STORE})"
    for native, sdk in _TRANSLATIONS:
        if isinstance(error, native):
            return sdk(message=text, error=error)
    raise AssertionError(f"no translation of {error!r}")  # PoisonqError is the last


@contextmanager
def translated() -> Iterator[None]:
    """Raise poisonq's errors as the SDK's (:func:`translate`), the poisonq one chained."""
    try:
        yield
    except errors.InvalidOptionError:
        raise
    except errors.PoisonqError as exc:
        raise translate(exc) from exc


__all__ = [
    "AutoLockRenewFailed",
    "AutoLockRenewTimeout",
    "FeatureNotSupportedError",
    "MessageAlreadySettled",
    "MessageLockLostError",
    "MessageNotFoundError",
    "MessageSizeExceededError",
    "MessagingEntityAlreadyExistsError",
    "MessagingEntityDisabledError",
    "MessagingEntityNotFoundError",
    "OperationTimeoutError",
    "ServiceBusAuthenticationError",
    "ServiceBusAuthorizationError",
    "ServiceBusCommunicationError",
    "ServiceBusConnectionError",
    "ServiceBusError",
    "ServiceBusQuotaExceededError",
    "ServiceBusServerBusyError",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
    "translate",
    "translated",
]
