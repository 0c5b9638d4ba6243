"""The engine on PostgreSQL's asyncio store against the same engine on the blocking store, in
the same run: what the one core costs on an event loop.

A cycle is a send of one message, a receive of it and its completion (three transactions),
made by one caller that waits for each, through :class:`poisonq.engine.Engine` on a
:class:`~poisonq.store.postgres.PostgresStore` (run to its end by ``drive()``, no loop: the
sync API's path) and on an :class:`~poisonq.store.postgres.AsyncPostgresStore` (awaited on one
event loop). ``--rounds`` rounds, who goes first alternating; each prints nothing, and at the
end one line with the medians:

    part=engine store=postgresql sync_ops_per_s=... async_ops_per_s=... ratio=...

(``ops``: cycles; ``ratio``: the median of the rounds' async/sync ratios.) ``part=floor``
(``bench/aio_floor.py``) is the same comparison with nothing of poisonq in it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from poisonq import ManualClock, Message
from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.options import QueueOptions
from poisonq.store.postgres import AsyncPostgresStore, PostgresStore


async def _async_cycles(engine: Engine, queue: str, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        await engine.send(queue, [Message(body=b"x")])
        (got,) = await engine.receive(queue, 1)
        await engine.complete(queue, [(got.sequence_number, got.lock_token)])
    return cycles / (time.perf_counter() - started)


def _sync_cycles(engine: Engine, queue: str, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        drive(engine.send(queue, [Message(body=b"x")]))
        (got,) = drive(engine.receive(queue, 1))
        drive(engine.complete(queue, [(got.sequence_number, got.lock_token)]))
    return cycles / (time.perf_counter() - started)


async def engine_line(url: str, cycles: int, rounds: int) -> str:
    """The ``part=engine`` line, both stores open side by side on the database at ``url``."""
    with PostgresStore.from_url(url) as blocking:
        async with await AsyncPostgresStore.open(url) as native:
            sync_engine = Engine(blocking, ManualClock())
            async_engine = Engine(native, ManualClock())
            drive(sync_engine.create_queue("sync-cycles", QueueOptions()))
            await async_engine.create_queue("async-cycles", QueueOptions())
            # Warm both (connections, the server's caches) before anything counts.
            _sync_cycles(sync_engine, "sync-cycles", 20)
            await _async_cycles(async_engine, "async-cycles", 20)
            sync_rates, async_rates = [], []
            for turn in range(rounds):
                if turn % 2:
                    async_rates.append(await _async_cycles(async_engine, "async-cycles", cycles))
                    sync_rates.append(_sync_cycles(sync_engine, "sync-cycles", cycles))
                else:
                    sync_rates.append(_sync_cycles(sync_engine, "sync-cycles", cycles))
                    async_rates.append(await _async_cycles(async_engine, "async-cycles", cycles))
    ratio = statistics.median(a / s for a, s in zip(async_rates, sync_rates, strict=True))
    return (
        f"part=engine store=postgresql sync_ops_per_s={statistics.median(sync_rates):.0f}"
        f" async_ops_per_s={statistics.median(async_rates):.0f} ratio={ratio:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a PostgreSQL URL (default: a temporary server)")
    parser.add_argument("--cycles", type=int, default=500, help="per store and round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.url:
        print(asyncio.run(engine_line(args.url, args.cycles, args.rounds)), flush=True)
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        url = server.create_database("engine")
        print(asyncio.run(engine_line(url, args.cycles, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
