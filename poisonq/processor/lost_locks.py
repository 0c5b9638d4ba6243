"""The locks a Processor lost before it settled their messages, each reported once.

A lock is lost when its renewal fails, or stops at ``max_lock_renewal_duration`` while the
handler still runs; the renewer may see it first, or the settlement that finds it gone. Both
Processors report it the same way: a warning, and ``on_lock_lost(message)`` once per message
and lock. The message is delivered again; a message handler does not run on one whose lock
is known lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from poisonq.model import ReceivedMessage

log = logging.getLogger(__name__)

LockLostHook = Callable[[ReceivedMessage], Any]


class LostLocks:
    """What one Processor run knows lost; ``report`` and ``known`` may be called from any
    thread (the renewer's passes run in one of their own)."""

    def __init__(self, address: str, hook: LockLostHook | None) -> None:
        self._address = address
        self._hook = hook
        self._lost: set[tuple[int, str]] = set()
        self._guard = threading.Lock()

    def report(self, message: ReceivedMessage) -> Any:
        """Log a lost lock and call the hook, the first time for this message and lock;
        what the hook returned (the asyncio Processor awaits a coroutine's), else ``None``."""
        key = (message.sequence_number, message.lock_token or "")
        with self._guard:
            if key in self._lost:
                return None
            self._lost.add(key)
        log.warning(
            "lost the lock on message %d of %s: it was not settled and will be delivered again",
            message.sequence_number,
            self._address,
        )
        return None if self._hook is None else self._hook(message)

    def known(self, message: ReceivedMessage) -> bool:
        with self._guard:
            return (message.sequence_number, message.lock_token or "") in self._lost
