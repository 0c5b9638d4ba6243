"""The crash rule's gate for the asyncio Processor (:mod:`poisonq.processor.suspects` says the
rule, and holds the sync Processor's gate for threads): a suspect runs while no other pump
task holds a message under a lock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class AloneGate:
    """The crash rule's gate for pump tasks on one loop: a task holds it while it holds
    messages under a lock; a task with a suspect claims it, and runs the suspect once no
    other task holds it; tasks that see it wanted give back what they hold and let go.

    Letting go and unclaiming are plain calls, and a cancelled wait changes nothing (a
    cancelled claim is withdrawn): a pump task cancelled anywhere leaves the gate as it
    found it, so no other task's cleanup waits on it for ever."""

    def __init__(self) -> None:
        self._holders = 0
        self._claimed = False
        self._changed = asyncio.Event()  # set, and replaced, at every change

    def wanted(self) -> bool:
        return self._claimed

    async def hold(self) -> None:
        await self._until(lambda: not self._claimed)
        self._holders += 1

    def let_go(self) -> None:
        self._holders -= 1
        self._change()

    async def alone(self) -> None:
        """Claim the gate (once no other task has) and wait until no task holds it."""
        await self._until(lambda: not self._claimed)
        self._claimed = True
        try:
            await self._until(lambda: self._holders == 0)
        except BaseException:
            self.unclaim()
            raise

    def unclaim(self) -> None:
        self._claimed = False
        self._change()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    def _change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
