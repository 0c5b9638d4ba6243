"""The one source of time. Tests use :class:`ManualClock` and move it instead of sleeping.

A broker's default clock is its store's: on PostgreSQL, which clients on several hosts share,
the database server's time (:class:`ServerClock`); on SQLite, one machine's file, the local
clock (:class:`SystemClock`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from poisonq.errors import StoreError

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch; message times are stamped with this."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a manual clock moves itself forward instead)."""
        ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it at once. Thread-safe."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class ServerClock:
    """The database server's time, for a store that clients on several hosts share.

    An expired lock, a time-to-live or a scheduled message is due by the store's clock, not
    by the clock of whichever client looks (a reader housekeeps, and a reader on a host whose
    clock runs ahead would otherwise expire the locks of healthy consumers). ``now()`` is
    the ``local`` clock (monotonic, so a local clock stepped by NTP or by hand changes
    nothing) plus an offset measured against the server: ``measure_offset(local)`` gives the
    server's clock less ``local()`` (the store times it within a round trip, not around the
    wait for a connection: processes of one host measuring through a busy pool would
    otherwise disagree by a fraction of a second, enough to expire each other's short
    locks). The offset is measured when the clock is made and again every ``every`` seconds
    by the thread that asks for the time then; the others go on with the offset they have,
    so no ``now()`` waits for the server but that one. A measurement that fails keeps the
    last offset until the next one is due."""

    def __init__(
        self,
        measure_offset: Callable[[Callable[[], float]], float],
        *,
        local: Callable[[], float] = time.monotonic,
        every: float = 60.0,
    ) -> None:
        self._measure = measure_offset
        self._local = local
        self._every = every
        self._measuring = threading.Lock()
        self._offset = self._measured()
        self._next = time.monotonic() + every

    def _measured(self) -> float:
        return self._measure(self._local)

    def now(self) -> float:
        if time.monotonic() >= self._next and self._measuring.acquire(blocking=False):
            try:
                self._next = time.monotonic() + self._every
                self._offset = self._measured()
            except StoreError as exc:
                log.debug("could not measure the store's clock, keeping the last offset: %s", exc)
            finally:
                self._measuring.release()
        return self._local() + self._offset

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
