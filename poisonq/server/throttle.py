"""Slowing down whoever guesses the token.

After ``LIMIT`` wrong tokens from one client within ``WINDOW`` seconds (the UI's login form or
the API's bearer header alike), that client's wrong tokens are answered 429 with
``Retry-After`` instead of 401, for a while that doubles with each further round of wrong
guesses (1 min, 2, 4, ... up to an hour), those it sends while refused counting too. Only
wrong tokens are refused: the right one always works (``Auth`` compares it first), so
nobody who shares the client's address (a Prometheus, an operator, a script; everyone behind
a proxy) can be locked out by someone else's guesses. For the same reason the right token
does not clear the record: a scrape every 15 s would wipe a guesser's count on the same
address. A client is its IP address (as the proxy reports it, from the addresses allowed to).
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

    def failed(self, client: str) -> None:
        """Count a wrong token from ``client``; the ``LIMIT``-th within ``WINDOW`` starts (or
        lengthens) a refusal. Raises :class:`Throttled` when the client was refused already:
        the answer is 429, not 401."""
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
            refused = record.refused_until > now
            record.failures = [t for t in record.failures if t > now - WINDOW] + [now]
            if len(record.failures) >= LIMIT:
                record.failures.clear()
                wait = min(MAX_WAIT, FIRST_WAIT * 2**record.rounds)
                record.refused_until = max(record.refused_until, now + wait)
                record.rounds += 1
            if refused:
                raise Throttled(math.ceil(record.refused_until - now))
