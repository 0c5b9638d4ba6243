"""Keeping a lease's locks while the driver works on its batch.

A batch's locks last the lock duration from when it was leased (or its partitions read); a
batch that runs longer (a big pipeline job, a streaming handler bisected into many calls)
would lose them, and its messages would be delivered again while it writes them. So the
driver renews the lease from a thread for as long as the batch runs; and the lease the
pipeline runner took ahead, which waits for the batch.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import poisonq
from poisonq.model import Lease


def taken_ahead(ahead: Future[Lease | None] | None) -> Lease | None:
    """The lease taken ahead, if it was taken by now."""
    if ahead is None or not ahead.done() or ahead.exception() is not None:
        return None
    return ahead.result()


class LeaseRenewer:
    """Renews a lease's locks from a thread while its batch runs, every third of the lock
    duration, so a long batch never loses its lease; and those of the lease taken
    ``ahead``, once it is taken."""

    def __init__(
        self,
        broker: poisonq.Broker,
        lease: Lease,
        lock_duration: float | None,
        ahead: Future[Lease | None] | None = None,
    ) -> None:
        self._broker = broker
        self._lease = lease
        self._ahead = ahead
        self._duration = lock_duration
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poisonq-lease-renewer", daemon=True)

    def _run(self) -> None:
        seconds = self._duration or self._broker.get_queue(self._lease.entity).options.lock_duration
        while not self._stop.wait(seconds / 3):
            self._broker.renew_lease(self._lease, self._duration)
            if (next_lease := taken_ahead(self._ahead)) is not None:
                self._broker.renew_lease(next_lease, self._duration)

    def __enter__(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
