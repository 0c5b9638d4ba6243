"""The one source of time. Tests use :class:`ManualClock` and move it instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


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
