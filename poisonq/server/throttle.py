"""Slowing down whoever guesses the token.

After ``limit`` wrong tokens from one client within ``window`` seconds (the UI's login form or
the API's bearer header alike), that client is refused, right token or not, for a while that
doubles with each further round of wrong guesses (1 min, 2, 4, ... up to an hour): 429 with
``Retry-After``. A right token clears the client's record. A client is its IP address, so
behind a proxy every user shares one record: keep the proxy's own rate limit in front then.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from poisonq.clock import Clock

LIMIT = 5  # wrong tokens ...
WINDOW = 60.0  # ... within this many seconds
FIRST_WAIT = 60.0  # seconds refused after the first round; doubles each round
MAX_WAIT = 3600.0


class Throttled(Exception):
    """This client sent too many wrong tokens; it may try again in ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many wrong tokens: try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass(slots=True)
class _Client:
    failures: list[float] = field(default_factory=list)  # times of recent wrong tokens
    rounds: int = 0  # how many times it was refused: the wait doubles with each
    refused_until: float = 0.0


class Throttle:
    """Wrong tokens per client, in this process's memory. Thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._clients: dict[str, _Client] = {}
        self._lock = threading.Lock()

    def check(self, client: str) -> None:
        """Raise :class:`Throttled` while ``client`` is refused."""
        now = self._clock.now()
        with self._lock:
            record = self._clients.get(client)
            if record is not None and record.refused_until > now:
                raise Throttled(math.ceil(record.refused_until - now))

    def failed(self, client: str) -> None:
        """Count a wrong token from ``client``; the ``LIMIT``-th within ``WINDOW`` starts a
        refusal."""
        now = self._clock.now()
        with self._lock:
            # Forget clients that have been quiet for longer than any wait, so the record
            # of a scan from many addresses does not grow without end.
            self._clients = {
                k: c
                for k, c in self._clients.items()
                if c.refused_until > now - MAX_WAIT
                or (c.failures and c.failures[-1] > now - WINDOW)
            }
            record = self._clients.setdefault(client, _Client())
            record.failures = [t for t in record.failures if t > now - WINDOW] + [now]
            if len(record.failures) >= LIMIT:
                record.failures.clear()
                record.refused_until = now + min(MAX_WAIT, FIRST_WAIT * 2**record.rounds)
                record.rounds += 1

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._clients.pop(client, None)
