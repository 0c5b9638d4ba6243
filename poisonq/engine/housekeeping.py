"""Time on the store's clock: what is due of an entity (locks that ran out, and the poison
decision they trigger; scheduled messages whose time has come; messages back from a retry
cycle; time-to-lives that passed) is applied before anyone reads the entity, so every reader
sees it when it is due, whether or not anyone receives.

Every read of an entity's state first asks the store a cheap indexed question, whether
anything of it is due (:meth:`~poisonq.store.base.Transaction.housekeeping_due`), in a read
transaction; an idle read stays that one read (on SQLite it neither takes nor waits for the
write lock). When something is due, the entity's housekeeping runs in a write transaction
of its own, the same the receive runs (:meth:`~poisonq.engine.poison.Poisoner.housekeep`),
and the read follows it there. Several readers and receivers, in any processes, may find the
same thing due at once: each transition is guarded (SQLite serializes writers with ``BEGIN
IMMEDIATE``; PostgreSQL locks the rows it releases, skipping those another transaction
holds), so what one applied the next finds done, and nothing is applied twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from poisonq.clock import Clock
from poisonq.engine.poison import Poisoner
from poisonq.engine.resolving import Resolver
from poisonq.engine.targets import Target
from poisonq.errors import EntityNotFoundError
from poisonq.model import SubQueue
from poisonq.store.base import Store, Transaction

T = TypeVar("T")


class Housekeeper:
    """Reads that see the store's clock: :meth:`read` (one entity), :meth:`read_all` (every
    entity), and :meth:`run`, one pass that applies what is due everywhere (``poisonq
    housekeep``, the server's loop)."""

    def __init__(self, store: Store, resolver: Resolver, poisoner: Poisoner, clock: Clock):
        self.store = store
        self.resolver = resolver
        self.poisoner = poisoner
        self.clock = clock

    async def read(
        self,
        address: str,
        read: Callable[[Transaction, Target], Awaitable[T]],
        subqueue: SubQueue | str | None = None,
    ) -> T:
        """``read`` of the entity ``address`` names, once what is due of it is applied. An
        address that names nothing raises as it always did, before anything is applied."""
        now = self.clock.now()
        async with self.store.reading() as tx:
            target = await self.resolver.resolve(tx, address, subqueue)
            if not await self._due(tx, target, now):
                return await read(tx, target)
        async with self.store.transaction() as tx:
            await self._apply(tx, await self.resolver.resolve(tx, address, subqueue), now)
            return await read(tx, await self.resolver.resolve(tx, address, subqueue))

    async def read_all(self, read: Callable[[Transaction], Awaitable[T]]) -> T:
        """``read`` of the whole store, once what is due of every entity is applied (one
        write transaction per entity that has something due)."""
        now = self.clock.now()
        async with self.store.reading() as tx:
            due = await tx.entities_due(now)
            if not due:
                return await read(tx)
        await self._apply_each(due, now)
        async with self.store.reading() as tx:
            return await read(tx)

    async def run(self) -> list[str]:
        """Apply what is due of every entity, one write transaction each; the names of the
        entities where something was."""
        now = self.clock.now()
        async with self.store.reading() as tx:
            due = await tx.entities_due(now)
        await self._apply_each(due, now)
        return due

    async def _apply_each(self, names: list[str], now: float) -> None:
        for name in names:
            try:
                async with self.store.transaction() as tx:
                    await self._apply(tx, await self.resolver.resolve(tx, name), now)
            except EntityNotFoundError:
                continue  # deleted meanwhile: nothing of it is due any more

    async def _due(self, tx: Transaction, target: Target, now: float) -> bool:
        for each in self._family(target):
            if await self._due_here(tx, each, now):
                return True
        return False

    async def _due_here(self, tx: Transaction, target: Target, now: float) -> bool:
        entity = target.entity
        cycle_id = entity.id
        if target.subqueue is None and target.options.retry.max_retry_cycles:
            cycle_id = (await self.resolver.child(tx, target, SubQueue.RETRY)).id
        return await tx.housekeeping_due(entity.id, cycle_id, now)

    async def _apply(self, tx: Transaction, target: Target, now: float) -> None:
        for each in self._family(target):
            await self.poisoner.housekeep(tx, each, now)

    def _family(self, target: Target) -> list[Target]:
        """Whose housekeeping a read of ``target`` must see: its own, and a subqueue's
        queue's, whose housekeeping moves messages into it (a dead-letter queue gets the
        expired and the poisoned) and out of it (the retry subqueue's due messages)."""
        if target.subqueue is None:
            return [target]
        return [self.resolver.of(target.queue), target]
