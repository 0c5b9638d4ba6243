"""What every operation of the engine works with: the store, the clock, and the three
collaborators that run inside an operation's transaction — resolving addresses
(:class:`~poisonq.engine.resolving.Resolver`), moving messages between entities
(:class:`~poisonq.engine.routing.Router`) and the poison rules
(:class:`~poisonq.engine.poison.Poisoner`) — and the
:class:`~poisonq.engine.housekeeping.Housekeeper`, through which every read sees what is due
on the store's clock applied."""

from __future__ import annotations

from poisonq.clock import Clock
from poisonq.engine.housekeeping import Housekeeper
from poisonq.engine.poison import Poisoner
from poisonq.engine.resolving import Resolver
from poisonq.engine.routing import Router
from poisonq.store.base import Store


class EngineBase:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        store.history.clock = clock  # the history's buckets on the messages' time
        self.resolver = Resolver(clock)
        self.router = Router(self.resolver)
        self.poisoner = Poisoner(self.resolver, self.router, clock)
        self.housekeeper = Housekeeper(store, self.resolver, self.poisoner, clock)
