"""The engine on PostgreSQL's asyncio store against the same engine on the blocking store, in
the same run: what the one core costs on an event loop.

A cycle is a send of one message, a receive of it and its completion (three transactions),
made by one caller that waits for each, through :class:`poisonq.engine.Engine` on a
:class:`~poisonq.store.postgres.PostgresStore` (run to its end by ``drive()``, no loop: the
sync API's path) and on an :class:`~poisonq.store.postgres.AsyncPostgresStore` (awaited on one
event loop). ``--rounds`` rounds, who goes first alternating; at the end one line with the
medians:

    part=engine store=postgresql sync_ops_per_s=... async_ops_per_s=... ratio=...

(``ops``: cycles; ``ratio``: the median of the rounds' async/sync ratios.) Then the same with
``--callers`` callers side by side, each on a queue of its own and the pool as large:
coroutines on the one loop against threads on the blocking store (``--cycles`` in all):

    part=engine-callers callers=20 store=postgresql sync_ops_per_s=... async_ops_per_s=...

``part=floor``
(``bench/aio_floor.py``) is the same comparison with nothing of poisonq in it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from poisonq import ManualClock, Message
from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.options import QueueOptions
from poisonq.store.postgres import AsyncPostgresStore, PostgresStore


async def _async_cycles(engine: Engine, queues: list[str], cycles: int) -> float:
    """Cycles per second of one caller per queue, side by side on the loop."""

    async def caller(queue: str) -> None:
        for _ in range(cycles):
            await engine.send(queue, [Message(body=b"x")])
            (got,) = await engine.receive(queue, 1)
            await engine.complete(queue, [(got.sequence_number, got.lock_token or "")])

    started = time.perf_counter()
    await asyncio.gather(*map(caller, queues))
    return cycles * len(queues) / (time.perf_counter() - started)


def _sync_cycles(engine: Engine, queues: list[str], cycles: int) -> float:
    """Cycles per second of one caller per queue, each a thread (one: the calling one)."""

    def caller(queue: str) -> None:
        for _ in range(cycles):
            drive(engine.send(queue, [Message(body=b"x")]))
            (got,) = drive(engine.receive(queue, 1))
            drive(engine.complete(queue, [(got.sequence_number, got.lock_token or "")]))

    started = time.perf_counter()
    if len(queues) == 1:
        caller(queues[0])
    else:
        with ThreadPoolExecutor(len(queues)) as threads:
            list(threads.map(caller, queues))
    return cycles * len(queues) / (time.perf_counter() - started)


async def engine_line(url: str, cycles: int, rounds: int, callers: int = 1) -> str:
    """The ``part=engine`` line (``callers``: each with a queue of its own, on a pool of as
    many connections), both stores open side by side on the database at ``url``."""
    with PostgresStore(url, pool_size=callers) as blocking:
        async with await AsyncPostgresStore.open(url, max_size=callers) as native:
            sync_engine = Engine(blocking, ManualClock())
            async_engine = Engine(native, ManualClock())
            sync_queues = [f"sync-{callers}-{n}" for n in range(callers)]
            async_queues = [f"async-{callers}-{n}" for n in range(callers)]
            for queue in sync_queues:
                drive(sync_engine.create_queue(queue, QueueOptions()))
            for queue in async_queues:
                await async_engine.create_queue(queue, QueueOptions())
            # Warm both (connections, the server's caches) before anything counts.
            _sync_cycles(sync_engine, sync_queues, 10)
            await _async_cycles(async_engine, async_queues, 10)
            sync_rates, async_rates = [], []
            for turn in range(rounds):
                if turn % 2:
                    async_rates.append(await _async_cycles(async_engine, async_queues, cycles))
                    sync_rates.append(_sync_cycles(sync_engine, sync_queues, cycles))
                else:
                    sync_rates.append(_sync_cycles(sync_engine, sync_queues, cycles))
                    async_rates.append(await _async_cycles(async_engine, async_queues, cycles))
    ratio = statistics.median(a / s for a, s in zip(async_rates, sync_rates, strict=True))
    part = "engine" if callers == 1 else f"engine-callers callers={callers}"
    return (
        f"part={part} store=postgresql sync_ops_per_s={statistics.median(sync_rates):.0f}"
        f" async_ops_per_s={statistics.median(async_rates):.0f} ratio={ratio:.2f}"
    )


def _lines(url: str, args: argparse.Namespace) -> str:
    lines = [asyncio.run(engine_line(url, args.cycles, args.rounds))]
    if args.callers > 1:
        cycles = max(1, args.cycles // args.callers)
        lines.append(asyncio.run(engine_line(url, cycles, args.rounds, args.callers)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a PostgreSQL URL (default: a temporary server)")
    parser.add_argument("--cycles", type=int, default=500, help="per store and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--callers", type=int, default=20, help="for the second line; 1: none")
    args = parser.parse_args()
    if args.url:
        print(_lines(args.url, args), flush=True)
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        print(_lines(server.create_database("engine"), args), flush=True)


if __name__ == "__main__":
    main()
