"""The crash rule's gate for the asyncio Processor (:mod:`poisonq.processor.suspects` says the
rule, and holds the sync Processor's gate for threads): a suspect runs while no other pump
task holds a message under a lock."""

from __future__ import annotations

import asyncio


class AloneGate:
    """The crash rule's gate for pump tasks on one loop: a task holds it while it holds
    messages under a lock; a task with a suspect claims it, and runs the suspect once no
    other task holds it; tasks that see it wanted give back what they hold and let go."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._holders = 0
        self._claimed = False

    def wanted(self) -> bool:
        return self._claimed

    async def hold(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._claimed)
            self._holders += 1

    async def let_go(self) -> None:
        async with self._changed:
            self._holders -= 1
            self._changed.notify_all()

    async def alone(self) -> None:
        """Claim the gate (once no other task has) and wait until no task holds it."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._claimed)
            self._claimed = True
            await self._changed.wait_for(lambda: self._holders == 0)

    async def unclaim(self) -> None:
        async with self._changed:
            self._claimed = False
            self._changed.notify_all()
