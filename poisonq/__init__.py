"""poisonq: a durable message queue with first-class poison-message handling.

The public names are imported when first used (PEP 562): ``import poisonq`` alone loads this
file only, so a process that needs one small module (the crash guard's helper, unpickling a
transform that raises ``poisonq.PermanentError``) does not load the client, the engine and the
stores, and stays small and quick to fork. Type checkers read the imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from poisonq.client import NO_VALUE, Broker, Receiver, Sender, SessionReceiver, connect
    from poisonq.clock import ManualClock, SystemClock
    from poisonq.errors import (
        BrokerClosedError,
        EntityDisabledError,
        EntityExistsError,
        EntityNotFoundError,
        FilterError,
        InvalidNameError,
        InvalidOperationError,
        InvalidOptionError,
        MessageAlreadySettledError,
        MessageLockLostError,
        MessageNotFoundError,
        MessageTooLargeError,
        PermanentError,
        PipelineLeaseHeldError,
        PipelineNotFoundError,
        PoisonMessageError,
        PoisonqError,
        QuotaExceededError,
        SessionCannotBeLockedError,
        SessionLockLostError,
        StoreConflictError,
        StoreError,
        StoreFullError,
        StoreNotFoundError,
        StoreUnavailableError,
        TaskNotFoundError,
        TaskRunningError,
    )
    from poisonq.filters import CorrelationFilter, SqlFilter
    from poisonq.lock_renewer import AutoLockRenewer
    from poisonq.model import (
        Abandon,
        Complete,
        DeadLetter,
        DeadLetterReason,
        EntityKind,
        EntityStatus,
        FailureRecord,
        Lease,
        Message,
        MessageState,
        ReceivedMessage,
        ReceiveErrorHandling,
        ReceiveMode,
        Release,
        Settlement,
        SubQueue,
    )
    from poisonq.options import QueueOptions, RetryPolicy
    from poisonq.processor import Processor, ProcessorStats, ProcessorStoppedError
    from poisonq.timeline import BatchRun, PipelineBatch, PipelineSummary

__all__ = [
    "NO_VALUE",
    "Abandon",
    "AutoLockRenewer",
    "BatchRun",
    "Broker",
    "BrokerClosedError",
    "Complete",
    "CorrelationFilter",
    "DeadLetter",
    "DeadLetterReason",
    "EntityDisabledError",
    "EntityExistsError",
    "EntityKind",
    "EntityNotFoundError",
    "EntityStatus",
    "FailureRecord",
    "FilterError",
    "InvalidNameError",
    "InvalidOperationError",
    "InvalidOptionError",
    "Lease",
    "ManualClock",
    "Message",
    "MessageAlreadySettledError",
    "MessageLockLostError",
    "MessageNotFoundError",
    "MessageState",
    "MessageTooLargeError",
    "PermanentError",
    "PipelineBatch",
    "PipelineLeaseHeldError",
    "PipelineNotFoundError",
    "PipelineSummary",
    "PoisonMessageError",
    "PoisonqError",
    "Processor",
    "ProcessorStats",
    "ProcessorStoppedError",
    "QueueOptions",
    "QuotaExceededError",
    "ReceiveErrorHandling",
    "ReceiveMode",
    "ReceivedMessage",
    "Receiver",
    "Release",
    "RetryPolicy",
    "Sender",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
    "SessionReceiver",
    "Settlement",
    "SqlFilter",
    "StoreConflictError",
    "StoreError",
    "StoreFullError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "SubQueue",
    "SystemClock",
    "TaskNotFoundError",
    "TaskRunningError",
    "connect",
]

# The modules the names come from, lightest first: a name is taken from the first that has
# it, so looking up an error or a model class never loads the client.
_MODULES = (
    "poisonq.errors",
    "poisonq.model",
    "poisonq.timeline",
    "poisonq.clock",
    "poisonq.options",
    "poisonq.filters",
    "poisonq.client",
    "poisonq.lock_renewer",
    "poisonq.processor",
)


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module_name in _MODULES:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value  # the next look-up is a plain one
                return value
    raise AttributeError(f"module 'poisonq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
