"""Retrying an operation when the store was briefly unavailable (Service Bus' retry options).

A server that restarts, a connection dropped by the network, or a SQLite file whose write lock
another process held past the busy timeout fails an operation with
:class:`~poisonq.errors.StoreUnavailableError`; the same operation a moment later succeeds.
The client retries it with exponential backoff, as the Service Bus SDKs do, and this is kept
apart from a message's delivery count: an operation retried here is not a delivery. The
delays are ``retry_backoff_factor * 2**n`` seconds, at most ``retry_backoff_max``, each
spread by up to a fifth either way.

Every operation of the engine is one store transaction, so a retry repeats the whole
operation. When the connection was lost while the commit was in flight the first attempt may
have taken effect: a retried send may then add the batch twice (duplicate detection makes
that harmless), and a retried settlement raises :class:`~poisonq.errors.MessageLockLostError`
for the locks it already settled.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from poisonq.errors import InvalidOptionError, StoreUnavailableError
from poisonq.limits import check_count

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperationRetry:
    """How often and how patiently an operation is retried on a transient store error."""

    retry_total: int = 3
    retry_backoff_factor: float = 0.8
    retry_backoff_max: float = 120.0

    def __post_init__(self) -> None:
        check_count(self.retry_total, "retry_total", minimum=0)
        for name in ("retry_backoff_factor", "retry_backoff_max"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidOptionError(f"{name} must be a number of seconds >= 0: {value!r}")

    def delays(self) -> Iterator[float]:
        """The waits before each retry."""
        for attempt in range(self.retry_total):
            delay = min(self.retry_backoff_max, self.retry_backoff_factor * 2**attempt)
            yield delay * random.uniform(0.8, 1.2)


class RetryingEngine:
    """The engine with every public operation retried under an :class:`OperationRetry`.

    Wraps by composition: attributes pass through, callables come back wrapped."""

    def __init__(self, engine: Any, retry: OperationRetry) -> None:
        self._engine = engine
        self._retry = retry

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._engine, name)
        if name.startswith("_") or not callable(found):
            return found
        wrapped = retried(found, self._retry)
        setattr(self, name, wrapped)  # found here from now on, without __getattr__
        return wrapped


def retried(operation: Callable[..., Any], retry: OperationRetry) -> Callable[..., Any]:
    """``operation`` retried under ``retry`` when the store is briefly unavailable."""

    @functools.wraps(operation)
    def call(*args: Any, **kwargs: Any) -> Any:
        delays = retry.delays()
        while True:
            try:
                return operation(*args, **kwargs)
            except StoreUnavailableError as exc:
                delay = next(delays, None)
                if delay is None:
                    raise
                log.warning("%s failed (%s); retrying in %.1f s", operation.__name__, exc, delay)
                time.sleep(delay)

    return call
