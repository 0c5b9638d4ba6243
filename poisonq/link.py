"""What the broker's parts, its senders and its receivers use of it: a :class:`Link`.

A sender or receiver calls the engine's operations (each retried over a store outage), reads
the store's clock (a failure's time, the time a lock has left) and, to wait for messages,
asks the store whether anything changed. The :class:`~poisonq.Broker` hands each of them the
one link it holds, so none depends on the broker, nor on more of the store than its change
feed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from poisonq.clock import Clock
from poisonq.engine import Engine


class ChangeFeed(Protocol):
    """The store's change marker and the wait on it (a :class:`~poisonq.store.base.Store`
    is one)."""

    def change_marker(self) -> object:
        """A value that changes whenever a transaction (of any process) that made a message
        receivable commits (:meth:`poisonq.store.base.Store.change_marker`)."""

    def wait_for_change(self, marker: object, timeout: float) -> None:
        """Block until the change marker differs from ``marker``, or ``timeout`` passes."""


@dataclass(frozen=True)
class Link:
    """The engine's operations (retried), the store's clock and its change feed."""

    engine: Engine
    clock: Clock
    changes: ChangeFeed


class Linked(Protocol):
    """What hands out a link: the :class:`~poisonq.Broker`, to the senders and receivers it
    makes (which keep it as their ``broker``)."""

    @property
    def link(self) -> Link: ...
