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
that harmless). A retried completion is told so (``in_doubt``): a message it finds stored
nowhere was completed by the attempt before, not lost. Other settlements of a message the
first attempt already settled raise :class:`~poisonq.errors.MessageLockLostError`.

An outage is told in two log lines per client, not one per failed attempt: a warning when the
store first becomes unreachable and another when an operation succeeds on it again, with how
long it was away (:class:`Reachability`). The retries between them log at debug level.

How the engine gets its retries, and why that way: :func:`retrying`.
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from poisonq.errors import InvalidOptionError, StoreConflictError, StoreUnavailableError
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


class Reachability:
    """Whether a client's store answered its last operation, so that an outage is logged
    once when it begins and once when it ends, whatever the number of threads and retries
    in between."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._down_since: float | None = None  # monotonic time of the first failure

    def failed(self, error: StoreUnavailableError) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning("the store is unreachable, retrying until it is back: %s", error)

    def answered(self) -> None:
        if self._down_since is None:  # the common case, read without the lock
            return
        with self._lock:  # another thread may have told it first
            since, self._down_since = self._down_since, None
        if since is not None:
            away = time.monotonic() - since
            log.warning("store %s is reachable again after %.1f s", self.name, away)


_IN_DOUBT_AWARE = frozenset({"complete", "settle"})
"""The engine's operations that take ``in_doubt=True`` on a retry (see the module's doc)."""

E = TypeVar("E")
P = ParamSpec("P")
R = TypeVar("R")


async def blocking_pause(seconds: float) -> None:
    """The wait between attempts on a blocking store: the thread sleeps (its operations
    never wait on an event loop; see :mod:`poisonq.engine.driving`)."""
    time.sleep(seconds)


def retrying(
    engine: E,
    retry: OperationRetry,
    reachability: Reachability,
    pause: Callable[[float], Awaitable[None]] = blocking_pause,
) -> E:
    """``engine`` with every public operation retried under ``retry``, waiting between
    attempts with ``pause`` (``asyncio.sleep`` for an engine on an event loop's store).

    An engine whose operations are retried is still an engine, so this returns one: a
    shallow copy of ``engine`` (the same store, clock and collaborators) on which each
    public method of its class is the original's, bound to ``engine`` and wrapped by
    :func:`retried_operation`. Type checkers see the engine's own signatures, with no cast. An
    operation that calls another inside calls it on ``engine``, unwrapped, so retries
    never nest: only the outermost operation, which is one store transaction, is repeated.

    Why this and not the alternatives: a ``__getattr__`` proxy has no type but the one a
    cast claims; a class restating each operation would write the engine's methods twice;
    a retry decorator on the engine's methods would put the client's retry policy in the
    engine. An outage is told through ``reachability``."""
    copied = copy.copy(engine)
    for name in dir(type(engine)):
        if name.startswith("_") or not callable(getattr(type(engine), name)):
            continue
        operation = getattr(engine, name)
        wrapped = retried_operation(operation, retry, reachability, name in _IN_DOUBT_AWARE, pause)
        setattr(copied, name, wrapped)
    return copied


class _Attempts:
    """The retry policy of one call: how long to wait after each failure, and what the
    next attempt is told; shared by the plain and the coroutine wrappers below."""

    def __init__(
        self, name: str, retry: OperationRetry, reachability: Reachability, in_doubt_aware: bool
    ) -> None:
        self._name = name
        self._delays = retry.delays()
        self._reachability = reachability
        self._in_doubt_aware = in_doubt_aware

    def failed(self, exc: StoreUnavailableError, kwargs: dict[str, Any]) -> float:
        """The wait before the next attempt; re-raises ``exc`` when none is left."""
        delay = next(self._delays, None)
        if delay is None:
            raise exc
        if not isinstance(exc, StoreConflictError):  # a conflict committed nothing
            self._reachability.failed(exc)
            if self._in_doubt_aware:
                kwargs["in_doubt"] = True
        log.debug("%s failed (%s); retrying in %.1f s", self._name, exc, delay)
        return delay

    def answered(self) -> None:
        self._reachability.answered()


def retried(
    operation: Callable[P, R],
    retry: OperationRetry,
    reachability: Reachability,
    in_doubt_aware: bool = False,
) -> Callable[P, R]:
    """``operation`` retried under ``retry`` when the store is briefly unavailable; the
    outage is logged through ``reachability``. An ``in_doubt_aware`` operation's retries
    are called with ``in_doubt=True``."""
    name = getattr(operation, "__name__", "an operation")

    @functools.wraps(operation)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        attempts = _Attempts(name, retry, reachability, in_doubt_aware)
        while True:
            try:
                result = operation(*args, **kwargs)
            except StoreUnavailableError as exc:
                time.sleep(attempts.failed(exc, kwargs))
            else:
                attempts.answered()
                return result

    return call


def retried_operation(
    operation: Callable[P, Awaitable[R]],
    retry: OperationRetry,
    reachability: Reachability,
    in_doubt_aware: bool = False,
    pause: Callable[[float], Awaitable[None]] = blocking_pause,
) -> Callable[P, Coroutine[Any, Any, R]]:
    """:func:`retried` for an engine operation (a coroutine function), waiting between
    attempts with ``pause``."""
    name = getattr(operation, "__name__", "an operation")

    @functools.wraps(operation)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        attempts = _Attempts(name, retry, reachability, in_doubt_aware)
        while True:
            try:
                result = await operation(*args, **kwargs)
            except StoreUnavailableError as exc:
                await pause(attempts.failed(exc, kwargs))
            else:
                attempts.answered()
                return result

    return call
