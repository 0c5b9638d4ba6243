"""The crash rule: a message that may have killed its last holder runs alone.

A handler that kills its process (``os._exit``, a segfault in a native library, the
out-of-memory killer) takes down every message the process holds under a lock: their locks
run out, each counts a delivery, and the crasher comes back beside them. Were it received in
a batch again, each of its crashes would cost each of its batch-mates a delivery, until
``max_delivery_count`` dead-lettered good messages with it.

So a message whose last delivery ended with its lock running out while nobody settled it
(:attr:`~poisonq.model.ReceivedMessage.last_lock_expired`) is a suspect: the Processor
handles it alone and settles it before the next message starts, and while it runs the
process holds nothing else under a lock: not the rest of its batch, not another thread's
batch, not the failures held back for the defect window. A suspect received beside other
messages is given back (released, no delivery counted) and received again on its own. A
crash thus costs each message beside it one delivery, once (nothing could foresee the first
crash), and every later crash only the crasher's own.

Suspects are never first deliveries, so the defect window (:mod:`poisonq.defects`) does not
count them.
"""

from __future__ import annotations

import threading

from poisonq.model import ReceivedMessage


def is_suspect(message: ReceivedMessage) -> bool:
    """Whether the message may have killed its last holder (see the module docstring)."""
    return message.last_lock_expired


class AloneGate:
    """Lets one pump thread of a Processor run suspects while no other thread holds a message.

    A thread holds the gate (:meth:`hold`) before it receives, and lets go (:meth:`let_go`)
    once it holds no message under a lock. A thread with a suspect lets go of everything it
    holds, claims the gate (:meth:`claim`: other threads cannot take it then), and waits in
    :meth:`wait_alone` until no thread holds it; threads that see the gate :meth:`wanted`
    give back what they hold and let go. One claim at a time: a thread that cannot claim
    gives its suspects back for the claimant, who takes them one by one."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._holders = 0
        self._claimed = False

    def hold(self) -> None:
        """Wait until no thread has claimed the gate, then hold it."""
        with self._changed:
            self._changed.wait_for(lambda: not self._claimed)
            self._holders += 1

    def let_go(self) -> None:
        with self._changed:
            self._holders -= 1
            self._changed.notify_all()

    def wanted(self) -> bool:
        """Whether a thread waits to run suspects alone."""
        return self._claimed

    def claim(self) -> bool:
        """Claim the gate for this thread (which holds it not), unless another has."""
        with self._changed:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def wait_alone(self) -> None:
        """Wait until no thread holds the gate (the caller has claimed it)."""
        with self._changed:
            self._changed.wait_for(lambda: self._holders == 0)

    def unclaim(self) -> None:
        with self._changed:
            self._claimed = False
            self._changed.notify_all()
