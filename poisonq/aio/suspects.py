"""The crash rule's gate for the asyncio Processor (:mod:`poisonq.processor.suspects` says the
rule, and holds the sync Processor's gate for threads): a suspect runs while no other pump
task holds a message under a lock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class AloneGate:
    """The crash rule's gate for pump tasks on one loop: a task holds it while it holds
    messages under a lock; a task with a suspect claims it, and runs the suspect once no
    other task holds it; tasks that see it wanted give back what they hold and let go. One
    claim at a time: a task that cannot claim gives its suspects back for the claimant.

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

    def claim(self) -> bool:
        """Claim the gate, unless another task has: then the caller gives its suspects back
        for that task to take one by one, rather than wait holding them locked."""
        if self._claimed:
            return False
        self._claimed = True
        return True

    async def alone(self) -> None:
        """Claim the gate once no other task has (for a caller that holds no message under
        a lock meanwhile), and wait until no task holds it."""
        await self._until(lambda: not self._claimed)
        self._claimed = True
        try:
            await self.wait_alone()
        except BaseException:
            self.unclaim()
            raise

    async def wait_alone(self) -> None:
        """Wait until no task holds the gate, which the caller has claimed (and unclaims,
        whatever ends the wait)."""
        await self._until(lambda: self._holders == 0)

    def unclaim(self) -> None:
        self._claimed = False
        self._change()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    def _change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
