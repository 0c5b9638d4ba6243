"""poisonq: a durable message queue with first-class poison-message handling."""

from poisonq.client import AutoLockRenewer, Broker, Receiver, Sender, connect
from poisonq.clock import ManualClock, SystemClock
from poisonq.errors import (
    EntityDisabledError,
    EntityExistsError,
    EntityNotFoundError,
    InvalidNameError,
    InvalidOperationError,
    InvalidOptionError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageTooLargeError,
    PermanentError,
    PoisonqError,
    QuotaExceededError,
    StoreError,
)
from poisonq.model import (
    DeadLetterReason,
    EntityStatus,
    FailureRecord,
    Message,
    MessageState,
    ReceivedMessage,
    ReceiveErrorHandling,
    ReceiveMode,
    SubQueue,
)
from poisonq.options import QueueOptions, RetryPolicy
from poisonq.processor import Processor, ProcessorStats

__all__ = [
    "AutoLockRenewer",
    "Broker",
    "DeadLetterReason",
    "EntityDisabledError",
    "EntityExistsError",
    "EntityNotFoundError",
    "EntityStatus",
    "FailureRecord",
    "InvalidNameError",
    "InvalidOperationError",
    "InvalidOptionError",
    "ManualClock",
    "Message",
    "MessageLockLostError",
    "MessageNotFoundError",
    "MessageState",
    "MessageTooLargeError",
    "PermanentError",
    "PoisonqError",
    "Processor",
    "ProcessorStats",
    "QueueOptions",
    "QuotaExceededError",
    "ReceiveErrorHandling",
    "ReceiveMode",
    "ReceivedMessage",
    "Receiver",
    "RetryPolicy",
    "Sender",
    "StoreError",
    "SubQueue",
    "SystemClock",
    "connect",
]
