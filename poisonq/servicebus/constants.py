"""The enums and constants of azure-servicebus 7, with what each means in poisonq's words
(:data:`RECEIVE_MODES`, :data:`SUB_QUEUES`). No I/O: the asyncio flavour shares them."""

from __future__ import annotations

from enum import Enum, StrEnum

from poisonq.model import ReceiveMode, SubQueue


class _CaseInsensitive(StrEnum):
    """A string enum found by its value in any case, as the SDK's enums are."""

    @classmethod
    def _missing_(cls, value: object) -> _CaseInsensitive | None:
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower() or member.name == value.upper():
                    return member
        return None


class ServiceBusReceiveMode(_CaseInsensitive):
    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class ServiceBusSubQueue(_CaseInsensitive):
    DEAD_LETTER = "deadletter"
    TRANSFER_DEAD_LETTER = "transferdeadletter"


class ServiceBusMessageState(int, Enum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class ServiceBusSessionFilter(Enum):
    NEXT_AVAILABLE = 0


NEXT_AVAILABLE_SESSION = ServiceBusSessionFilter.NEXT_AVAILABLE
"""``session_id=NEXT_AVAILABLE_SESSION``: the next session with a message nobody holds."""


class TransportType(Enum):
    """Accepted and without effect: a store URL says how poisonq reaches its store."""

    Amqp = 1
    AmqpOverWebsocket = 2


RECEIVE_MODES = {
    ServiceBusReceiveMode.PEEK_LOCK: ReceiveMode.PEEK_LOCK,
    ServiceBusReceiveMode.RECEIVE_AND_DELETE: ReceiveMode.RECEIVE_AND_DELETE,
}
SUB_QUEUES = {
    ServiceBusSubQueue.DEAD_LETTER: SubQueue.DEADLETTER,
    ServiceBusSubQueue.TRANSFER_DEAD_LETTER: SubQueue.TRANSFER_DEADLETTER,
}


def native_receive_mode(value: ServiceBusReceiveMode | str) -> ReceiveMode:
    """poisonq's receive mode for the SDK's (its enum, or its value in any case)."""
    try:
        return RECEIVE_MODES[ServiceBusReceiveMode(value)]
    except ValueError:
        choices = ", ".join(m.value for m in ServiceBusReceiveMode)
        raise ValueError(f"receive_mode must be one of {choices}, not {value!r}") from None


def sdk_receive_mode(mode: ReceiveMode) -> ServiceBusReceiveMode:
    """The SDK's receive mode for poisonq's (a receiver's ``receive_mode``)."""
    return next(sdk for sdk, native in RECEIVE_MODES.items() if native is mode)


def native_sub_queue(value: ServiceBusSubQueue | str | None) -> SubQueue | None:
    """poisonq's subqueue for the SDK's ``sub_queue`` (``None``: the entity itself)."""
    if value is None:
        return None
    try:
        return SUB_QUEUES[ServiceBusSubQueue(value)]
    except ValueError:
        choices = ", ".join(q.value for q in ServiceBusSubQueue)
        raise ValueError(f"sub_queue must be one of {choices}, not {value!r}") from None
