"""What a Processor is told, checked once: the sync :class:`~poisonq.processor.Processor` and
the asyncio one (:mod:`poisonq.aio.processor`) both build a :class:`ProcessorOptions`, so an
option means and refuses the same thing in each."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, check_ratio
from poisonq.errors import InvalidOptionError, PermanentError
from poisonq.limits import check_count
from poisonq.model import to_seconds
from poisonq.processor.handler_runs import Isolation, check_isolation


def check_handler(handler: Callable[..., Any]) -> None:
    """A handler must be callable (a coroutine function, for the asyncio Processor, too)."""
    if not callable(handler):
        raise InvalidOptionError(f"handler must be callable, not {handler!r}")


def is_coroutine_function(handler: object) -> bool:
    """Whether calling ``handler`` gives a coroutine by its definition: an ``async def``
    function, an object whose ``__call__`` is one, or a ``functools.partial`` of either."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler):
        return True
    call = inspect.getattr_static(type(handler), "__call__", None)
    return not inspect.isroutine(handler) and inspect.iscoroutinefunction(call)


def check_sync_handler(handler: Callable[..., Any], name: str = "handler") -> None:
    """The sync Processor's handler (or hook, ``name``): callable, and not a coroutine
    function, which it would only call, never await (a handler that returns an awaitable
    anyway fails its run: :mod:`poisonq.processor.handler_runs`)."""
    check_handler(handler)
    if is_coroutine_function(handler):
        raise InvalidOptionError(
            f"{name} {handler!r} is a coroutine function, which poisonq.Processor cannot"
            " await: use poisonq.aio.Processor with an AsyncBroker"
        )


def check_broker(broker: object, expected: type, processor: str, instead: str) -> None:
    """A Processor's broker is of its own flavour: a :class:`~poisonq.Broker` for
    ``poisonq.Processor``, an :class:`~poisonq.aio.AsyncBroker` for ``poisonq.aio.Processor``;
    the other's would fail only in ``run()``, at the first call it makes differently.
    ``instead`` names the Processor for such a broker."""
    if not isinstance(broker, expected):
        raise InvalidOptionError(
            f"{processor} takes a broker of type {expected.__name__}, not {broker!r}:"
            f" for that broker, use {instead}"
        )


def check_hook(hook: object, name: str) -> None:
    """A hook (``on_poison``, ``on_lock_lost``) is ``None`` or callable: refused as the
    Processor is made, not at the first poisoned message, where ``5(...)`` would end the run."""
    if hook is not None and not callable(hook):
        raise InvalidOptionError(f"{name} must be callable or None, not {hook!r}")


def check_flag(value: object, name: str) -> bool:
    """A boolean option (``batch``, ``run(until_idle=...)``) is a bool: a string such as
    ``"false"`` or ``"no"`` is truthy, so taking it would do the opposite of what was meant."""
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{name} must be True or False, not {value!r}")
    return value


def check_permanent(permanent: object) -> tuple[type[BaseException], ...]:
    """``permanent`` as a tuple of exception types: one type alone is taken as if listed
    (``permanent=ValueError``); anything else, a string included, is refused whole."""
    if isinstance(permanent, type):
        permanent = (permanent,)
    if isinstance(permanent, (str, bytes)) or not isinstance(permanent, Iterable):
        raise InvalidOptionError(
            f"permanent must be an exception type or list exception types, not {permanent!r}"
        )
    kinds = tuple(permanent)
    for kind in kinds:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise InvalidOptionError(
                f"permanent must list exception types, not {kind!r} (in {permanent!r})"
            )
    return kinds


@dataclass(frozen=True)
class ProcessorOptions:
    """A Processor's options, each checked as the object is made (:class:`InvalidOptionError`);
    the defaults here are both Processors' defaults.

    ``batch_size`` messages are received (and, with ``batch=True``, handed to the handler) at
    a time by each of ``concurrency`` pumps; ``permanent`` lists the exception types that
    dead-letter at once (:class:`~poisonq.PermanentError` always among them); locks are
    renewed for at most ``max_lock_renewal_duration`` (seconds, a ``timedelta`` or ISO 8601
    text, as every duration); an idle receive waits ``max_wait``; ``max_failure_ratio`` is
    the defect window's ratio (``None``: never stop); ``isolation`` says where the handler
    runs (``"process"``: in a child process)."""

    batch_size: int = 1
    batch: bool = False
    concurrency: int = 1
    permanent: tuple[type[BaseException], ...] = ()
    max_lock_renewal_duration: float = 300.0
    max_wait: float = 1.0
    max_failure_ratio: float | None = DEFAULT_MAX_FAILURE_RATIO
    isolation: Isolation = None

    def __post_init__(self) -> None:
        # Durations may be given as any Duration (a timedelta, ISO 8601 text like "PT5M"),
        # and permanent as any sequence: each is kept
        # in the one form the pumps read (``of`` is how a Processor makes these).
        check_count(self.batch_size, "batch_size")
        check_count(self.concurrency, "concurrency")
        ratio = self.max_failure_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float))):
            raise InvalidOptionError(
                f"max_failure_ratio must be a number in (0, 1] or None, not {ratio!r}"
            )
        checked = {
            "batch": check_flag(self.batch, "batch"),
            "permanent": check_permanent(self.permanent),
            "max_lock_renewal_duration": to_seconds(
                self.max_lock_renewal_duration, "max_lock_renewal_duration"
            ),
            "max_wait": to_seconds(self.max_wait, "max_wait"),
            "max_failure_ratio": check_ratio(self.max_failure_ratio),
            "isolation": check_isolation(self.isolation),
        }
        for name, value in checked.items():  # frozen: set once, here
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, options: dict[str, Any]) -> ProcessorOptions:
        """The options a Processor's keyword arguments name (durations as seconds or a
        ``timedelta``); an unknown name is refused."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise InvalidOptionError(f"a Processor has no option {', '.join(unknown)}")
        return cls(**options)

    @property
    def permanent_errors(self) -> tuple[type[BaseException], ...]:
        """What dead-letters at once: :class:`~poisonq.PermanentError` and ``permanent``."""
        return (PermanentError, *self.permanent)
