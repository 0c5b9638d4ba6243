"""The asyncio API against the sync API, in the same run: the queue bench's phases, many
session receivers on one event loop, and a Processor whose handlers wait on I/O.

Prints machine-readable lines, one per store and part:

    store=sqlite part=queue async_produce_msgs_per_s=... sync_produce_msgs_per_s=...
        ratio_produce=... ratio_consume_complete=... ratio_dlq_move=...
    store=postgresql part=floor shape=pipeline batch=100 direct_tx_per_s=... ratio_thread=...
    store=postgresql part=sessions sessions=500 pool_size=20 late_accepts=0 msgs_per_s=...
        order_kept=true
    store=sqlite part=processor async_msgs_per_s=... sync_msgs_per_s=... ratio=...

``part=queue``: produce, consume+complete (``complete_and_receive``) and dead-letter moves
(``settle_and_receive``) through ``poisonq.aio`` and right beside them through the sync
``Broker`` (``bench/queue_throughput.py``'s own phases), ``--rounds`` times with who goes
first alternating; each ratio is the median of the rounds' async/sync ratios (target ≥ 0.9).
``part=floor`` (PostgreSQL, ``bench/aio_floor.py``): the same ratio with nothing of poisonq
in it, a bare transaction through a worker thread and through psycopg's async connection.
``part=sessions`` (PostgreSQL): ``--sessions`` session receivers on one loop with a pool of
``--pool-size`` connections, each accepting the next session and draining it; whether every
session came out in order. ``part=processor``: ``asyncio.sleep(--handler-wait)`` handlers in
the async Processor (``--concurrency`` tasks) against a sync Processor with one thread and a
``time.sleep`` handler (target: 10 times the rate or more).

Stores: a fresh SQLite file, and (``--postgres``) a temporary PostgreSQL server started from
the machine's binaries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import aio_floor
import pgmq_pattern
import queue_throughput

import poisonq
import poisonq.aio
from poisonq import DeadLetter, Message, ReceivedMessage
from poisonq.processor import Processor as SyncProcessor


async def _send(
    broker: poisonq.aio.AsyncBroker, queue: str, count: int, body: bytes, batch: int
) -> float:
    sender = broker.sender(queue)
    started = time.perf_counter()
    for start in range(0, count, batch):
        await sender.send([Message(body=body) for _ in range(min(batch, count - start))])
    return count / (time.perf_counter() - started)


async def _drain(
    broker: poisonq.aio.AsyncBroker, queue: str, count: int, batch: int, dead_letter: bool
) -> float:
    """As ``queue_throughput._drain``: settling a batch shares a transaction with receiving
    the next."""
    receiver = broker.receiver(queue)
    done = 0
    started = time.perf_counter()
    messages = await receiver.receive(max_messages=batch)
    while messages:
        done += len(messages)
        if dead_letter:
            moves = [DeadLetter(m.sequence_number, m.lock_token or "", "Bench") for m in messages]
            messages = await receiver.settle_and_receive(moves, max_messages=batch)
        else:
            messages = await receiver.complete_and_receive(messages, max_messages=batch)
    if done != count:
        raise SystemExit(f"expected {count} messages, received {done}")
    return count / (time.perf_counter() - started)


async def _beside(
    rates: tuple[pgmq_pattern.Rates, pgmq_pattern.Rates],
    first: bool,
    phase: str,
    mine: Coroutine[Any, Any, float],
    theirs: Callable[[], float],
) -> None:
    """One phase through the async API and right beside it through the sync one, in the
    order told (``pgmq_pattern.beside`` for a coroutine)."""
    ours, plain = rates
    if first:
        ours[phase] = await mine
        plain[phase] = theirs()
    else:
        plain[phase] = theirs()
        ours[phase] = await mine


async def _queue_round(
    abroker: poisonq.aio.AsyncBroker, sync: poisonq.Broker, number: int, args: argparse.Namespace
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    body = os.urandom(args.size // 2 + 1).hex()[: args.size].encode()
    n, batch, dead = args.messages, args.batch, args.dead_letter
    aq, sq = f"aio-{number}", f"sync-{number}"
    await abroker.create_queue(aq)
    sync.create_queue(sq)
    rates: tuple[pgmq_pattern.Rates, pgmq_pattern.Rates] = ({}, {})
    first = number % 2 == 0
    await _beside(
        rates,
        first,
        "produce",
        _send(abroker, aq, n, body, batch),
        lambda: queue_throughput._send(sync, sq, n, body, batch),
    )
    await _beside(
        rates,
        first,
        "consume_complete",
        _drain(abroker, aq, n, batch, False),
        lambda: queue_throughput._drain(sync, sq, n, batch, False),
    )
    await _send(abroker, aq, dead, body, batch)
    queue_throughput._send(sync, sq, dead, body, batch)
    await _beside(
        rates,
        first,
        "dlq_move",
        _drain(abroker, aq, dead, batch, True),
        lambda: queue_throughput._drain(sync, sq, dead, batch, True),
    )
    assert (await abroker.audit()).ok, "the ledger does not balance"
    return rates


async def _queue_part(url: str, args: argparse.Namespace) -> str:
    async with await poisonq.aio.connect(url) as abroker:
        with poisonq.connect(url) as sync:
            rounds = [await _queue_round(abroker, sync, n, args) for n in range(args.rounds)]
    rates, plain, ratios = pgmq_pattern.medians(rounds)
    return (
        f"part=queue {pgmq_pattern.rate_fields('async_', rates)} "
        f"{pgmq_pattern.rate_fields('sync_', plain)} {pgmq_pattern.ratio_fields(ratios)}"
    )


async def _sessions_part(url: str, args: argparse.Namespace) -> str:
    per = args.session_messages
    async with await poisonq.aio.connect(url, pool_size=args.pool_size) as broker:
        await broker.create_queue("chats", requires_session=True)
        sender = broker.sender("chats")
        for n in range(per):
            await sender.send(
                [Message(body=b"%d" % n, session_id=f"s{s}") for s in range(args.sessions)]
            )
        seen: dict[str, list[bytes]] = {}
        accepted = asyncio.Event()
        waiting = late = 0

        async def receiver() -> None:
            # Every receiver waits for its session at once, before any is drained: the 500
            # are on the loop together. One that waits out ``max_wait`` (a loaded machine)
            # is counted, and tries again once the others are draining.
            nonlocal waiting, late
            session = await broker.accept_next_session("chats", max_wait=30)
            waiting += 1
            if waiting == args.sessions:
                accepted.set()
            await accepted.wait()
            if session is None:
                late += 1
                session = await broker.accept_next_session("chats", max_wait=30)
                if session is None:
                    return  # its session is left undrained: order_kept=false says so
            async with session:
                while got := await session.receive(max_messages=per):
                    seen.setdefault(session.session_id, []).extend(m.body for m in got)
                    await session.complete(got)

        threads = threading.active_count()
        started = time.perf_counter()
        await asyncio.gather(*(receiver() for _ in range(args.sessions)))
        rate = args.sessions * per / (time.perf_counter() - started)
        extra_threads = threading.active_count() - threads
        kept = seen == {f"s{s}": [b"%d" % n for n in range(per)] for s in range(args.sessions)}
        assert (await broker.audit()).ok, "the ledger does not balance"
    return (
        f"part=sessions sessions={args.sessions} pool_size={args.pool_size} "
        f"threads_added={extra_threads} late_accepts={late} msgs_per_s={rate:.0f}"
        f" order_kept={str(kept).lower()}"
    )


async def _processor_part(url: str, args: argparse.Namespace) -> str:
    wait = args.handler_wait
    async with await poisonq.aio.connect(url) as broker:
        await broker.create_queue("aio-work")
        await broker.create_queue("sync-work")
        await broker.sender("aio-work").send(
            [Message(body=b"x") for _ in range(args.async_messages)]
        )
        await broker.sender("sync-work").send(
            [Message(body=b"x") for _ in range(args.sync_messages)]
        )

        async def handler(message: ReceivedMessage) -> None:
            await asyncio.sleep(wait)

        processor = poisonq.aio.Processor(
            broker, "aio-work", handler, concurrency=args.concurrency, batch_size=1, max_wait=0.2
        )
        started = time.perf_counter()
        stats = await processor.run(until_idle=True)
        async_rate = stats.completed / (time.perf_counter() - started - 0.2)

    # The sync Processor on a broker of its own: a sync receive that waits would share the
    # store's listening connection with the async broker's change watch.
    with poisonq.connect(url) as sync_broker:
        sync = SyncProcessor(sync_broker, "sync-work", lambda m: time.sleep(wait), max_wait=0.2)
        started = time.perf_counter()
        sync_stats = sync.run(until_idle=True)
        sync_rate = sync_stats.completed / (time.perf_counter() - started - 0.2)
    assert stats.completed == args.async_messages and sync_stats.completed == args.sync_messages
    return (
        f"part=processor handler_wait_s={wait} concurrency={args.concurrency} "
        f"async_msgs_per_s={async_rate:.1f} sync_msgs_per_s={sync_rate:.1f} "
        f"ratio={async_rate / sync_rate:.1f}"
    )


@contextlib.contextmanager
def _stores(args: argparse.Namespace, tmp: str) -> Iterator[list[tuple[str, str]]]:
    stores = [("sqlite", f"sqlite:///{tmp}/bench.db")]
    if not args.postgres:
        yield stores
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        yield [*stores, ("postgresql", server.create_database("bench"))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres", action="store_true", help="also on a temporary server")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--dead-letter", type=int, default=5_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--session-messages", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--handler-wait", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--async-messages", type=int, default=2_000)
    parser.add_argument("--sync-messages", type=int, default=60)
    aio_floor.add_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, _stores(args, tmp) as stores:
        for store, url in stores:
            print(f"store={store} {asyncio.run(_queue_part(url, args))}", flush=True)
            if store == "sqlite":
                floor = aio_floor.sqlite_floor_line(f"{tmp}/floor.db", args)
                print(f"store={store} {floor}", flush=True)
            if store == "postgresql":
                for line in aio_floor.floor_lines(url, args):
                    print(f"store={store} {line}", flush=True)
                print(f"store={store} {asyncio.run(_sessions_part(url, args))}", flush=True)
            print(f"store={store} {asyncio.run(_processor_part(url, args))}", flush=True)


if __name__ == "__main__":
    main()
