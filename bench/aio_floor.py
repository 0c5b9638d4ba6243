"""The floor under the asyncio API's ratio on PostgreSQL: what reaching the server from an
event loop costs a caller that waits for each transaction, with nothing of poisonq in it.

A transaction like a send of ``--batch`` messages (insert the rows, add to a counter, read it
back) runs ``--transactions`` times three ways, side by side in each round, who goes first
turning: ``direct`` (a sync psycopg connection on the calling thread: the sync API),
``thread`` (the same, handed to one worker thread and awaited: poisonq.aio's design) and
``async`` (psycopg's ``AsyncConnection`` on the loop: the design issue 32's text names). Two
shapes: ``pipeline`` (the statements in one pipeline, as poisonq's PostgreSQL store sends
them), ``statement`` (the same work as one statement) and ``consume`` (shaped like a
``complete_and_receive`` of ``--batch`` messages: three reads waited for, the entity's, the
batch to settle and the next batch with its bodies, and three writes that travel with them;
seven statements, as poisonq's consume transaction has nine). Prints, per shape, the medians
of the rounds' ratios to ``direct``:

    part=floor shape=pipeline batch=100 direct_tx_per_s=... ratio_thread=... ratio_async=...

A ratio below the asyncio API's target (0.9) here is a floor no design of the asyncio API
over the sync one can pass for a caller that waits for every call. SQLite has no asyncio
driver: its floor (:func:`sqlite_floor_line`, printed by ``bench/aio_throughput.py``) is the
send-shaped transaction on the calling thread against the same handed to a worker thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

_SCHEMA = (
    "DROP TABLE IF EXISTS floor_rows, floor_counts",
    "CREATE TABLE floor_rows (id bigserial PRIMARY KEY, body bytea NOT NULL)",
    "CREATE TABLE floor_counts (id int PRIMARY KEY, n bigint NOT NULL)",
    "INSERT INTO floor_counts VALUES (1, 0)",
)
_INSERT = "INSERT INTO floor_rows (body) SELECT unnest(%s::bytea[])"
_COUNT = "UPDATE floor_counts SET n = n + %s WHERE id = 1"
_READ = "SELECT n FROM floor_counts WHERE id = 1"
_ONE_STATEMENT = (
    "WITH added AS (INSERT INTO floor_rows (body) SELECT unnest(%s::bytea[]) RETURNING 1),"
    " counted AS (UPDATE floor_counts SET n = n + (SELECT count(*) FROM added) WHERE id = 1"
    " RETURNING n) SELECT n FROM counted"
)


_CONSUME = (
    ("SELECT n FROM floor_counts WHERE id = 1", False),
    ("SELECT id FROM floor_rows ORDER BY id LIMIT %(n)s", True),
    (
        "DELETE FROM floor_rows WHERE id IN (SELECT id FROM floor_rows ORDER BY id LIMIT %(n)s)",
        False,
    ),
    ("UPDATE floor_counts SET n = n + %(n)s WHERE id = 1", False),
    ("SELECT pg_advisory_xact_lock_shared(1, 2)", False),
    ("INSERT INTO floor_rows (body) SELECT unnest(%(bodies)s::bytea[]) RETURNING id, body", True),
)
"""The consume shape's statements, and whether each is read (waited for); the first read's
answer is waited for before the rest is sent, as poisonq waits for the entity's row."""


def _pipeline(conn: psycopg.Connection[Any], bodies: list[bytes]) -> None:
    with conn.transaction(), conn.pipeline():
        conn.execute(_INSERT, (bodies,))
        conn.execute(_COUNT, (len(bodies),))
        conn.execute(_READ).fetchone()


def _statement(conn: psycopg.Connection[Any], bodies: list[bytes]) -> None:
    conn.execute(_ONE_STATEMENT, (bodies,)).fetchone()


def _consume(conn: psycopg.Connection[Any], bodies: list[bytes]) -> None:
    params = {"n": len(bodies), "bodies": bodies}
    with conn.transaction(), conn.pipeline():
        conn.execute(_CONSUME[0][0]).fetchone()
        cursors = [(conn.execute(sql, params), read) for sql, read in _CONSUME[1:]]
        for cursor, read in cursors:
            if read:
                cursor.fetchall()


async def _aconsume(conn: psycopg.AsyncConnection[Any], bodies: list[bytes]) -> None:
    params = {"n": len(bodies), "bodies": bodies}
    async with conn.transaction(), conn.pipeline():
        await (await conn.execute(_CONSUME[0][0])).fetchone()
        cursors = [(await conn.execute(sql, params), read) for sql, read in _CONSUME[1:]]
        for cursor, read in cursors:
            if read:
                await cursor.fetchall()


async def _apipeline(conn: psycopg.AsyncConnection[Any], bodies: list[bytes]) -> None:
    async with conn.transaction(), conn.pipeline():
        await conn.execute(_INSERT, (bodies,))
        await conn.execute(_COUNT, (len(bodies),))
        await (await conn.execute(_READ)).fetchone()


async def _astatement(conn: psycopg.AsyncConnection[Any], bodies: list[bytes]) -> None:
    await (await conn.execute(_ONE_STATEMENT, (bodies,))).fetchone()


SHAPES: dict[str, tuple[Callable[..., None], Callable[..., Awaitable[None]]]] = {
    "pipeline": (_pipeline, _apipeline),
    "statement": (_statement, _astatement),
    "consume": (_consume, _aconsume),
}


Way = tuple[str, Callable[[], Awaitable[None]]]


def _blocking_ways(
    tx: Callable[[Any, list[bytes]], None],
    conn: Any,
    bodies: list[bytes],
    n: int,
    worker: ThreadPoolExecutor,
) -> list[Way]:
    """``direct``: ``tx`` ``n`` times on the calling thread; ``thread``: handed to ``worker``
    and awaited, ``n`` times."""
    loop = asyncio.get_running_loop()

    async def direct() -> None:
        for _ in range(n):
            tx(conn, bodies)

    async def thread() -> None:
        for _ in range(n):
            await loop.run_in_executor(worker, tx, conn, bodies)

    return [("direct", direct), ("thread", thread)]


async def _timed(ways: list[Way], first: int, n: int) -> dict[str, float]:
    """Seconds per transaction each way, starting with the ``first``-th."""
    seconds = {}
    for name, way in ways[first:] + ways[:first]:
        started = time.perf_counter()
        await way()
        seconds[name] = (time.perf_counter() - started) / n
    return seconds


async def _round(url: str, shape: str, args: argparse.Namespace, first: int) -> dict[str, float]:
    """Seconds per transaction each way, the ways taking turns to go first."""
    sync_tx, async_tx = SHAPES[shape]
    bodies = [os.urandom(args.size) for _ in range(args.batch)]
    n = args.transactions
    with (
        psycopg.connect(url, autocommit=True) as conn,
        ThreadPoolExecutor(1) as worker,
    ):
        aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:

            async def native() -> None:
                for _ in range(n):
                    await async_tx(aconn, bodies)

            ways = [*_blocking_ways(sync_tx, conn, bodies, n, worker), ("async", native)]
            return await _timed(ways, first, n)
        finally:
            await aconn.close()


def floor_lines(url: str, args: argparse.Namespace) -> list[str]:
    """One ``part=floor`` line per shape, on the database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _SCHEMA:
            conn.execute(statement)
    lines = []
    for shape in SHAPES:
        rounds = [asyncio.run(_round(url, shape, args, r % 3)) for r in range(args.floor_rounds)]

        def median_ratio(way: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r["direct"] / r[way] for r in rounds)

        direct = statistics.median(1 / r["direct"] for r in rounds)
        lines.append(
            f"part=floor shape={shape} batch={args.batch} direct_tx_per_s={direct:.0f}"
            f" ratio_thread={median_ratio('thread'):.2f} ratio_async={median_ratio('async'):.2f}"
        )
    return lines


_SQLITE_SCHEMA = (
    "DROP TABLE IF EXISTS floor_rows",
    "DROP TABLE IF EXISTS floor_counts",
    "CREATE TABLE floor_rows (id integer PRIMARY KEY, body blob NOT NULL)",
    "CREATE TABLE floor_counts (id int PRIMARY KEY, n integer NOT NULL)",
    "INSERT INTO floor_counts VALUES (1, 0)",
)


def _sqlite_send(conn: sqlite3.Connection, bodies: list[bytes]) -> None:
    with conn:
        conn.executemany("INSERT INTO floor_rows (body) VALUES (?)", [(b,) for b in bodies])
        conn.execute(_COUNT.replace("%s", "?"), (len(bodies),))
        conn.execute(_READ).fetchone()


async def _sqlite_round(path: str, args: argparse.Namespace, first: int) -> dict[str, float]:
    """Seconds per send-shaped SQLite transaction on the calling thread and through one
    worker thread, the two taking turns to go first."""
    bodies = [os.urandom(args.size) for _ in range(args.batch)]
    n = args.transactions
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in _SQLITE_SCHEMA:
            conn.execute(statement)
        conn.isolation_level = "DEFERRED"  # ``with conn`` begins and commits each send
        with ThreadPoolExecutor(1) as worker:
            ways = _blocking_ways(_sqlite_send, conn, bodies, n, worker)
            return await _timed(ways, first, n)
    finally:
        conn.close()


def sqlite_floor_line(path: str, args: argparse.Namespace) -> str:
    """The ``part=floor`` line of SQLite (a file at ``path``): it has no asyncio driver, so
    the floor of an asyncio API over it is the hand-off to a thread and back."""
    rounds = [asyncio.run(_sqlite_round(path, args, r % 2)) for r in range(args.floor_rounds)]
    direct = statistics.median(1 / r["direct"] for r in rounds)
    ratio = statistics.median(r["direct"] / r["thread"] for r in rounds)
    return (
        f"part=floor shape=send batch={args.batch} direct_tx_per_s={direct:.0f}"
        f" ratio_thread={ratio:.2f}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transactions", type=int, default=300, help="per way and round")
    parser.add_argument("--floor-rounds", type=int, default=15)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a PostgreSQL URL (default: a temporary server)")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    add_arguments(parser)
    args = parser.parse_args()
    if args.url:
        print("\n".join(floor_lines(args.url, args)), flush=True)
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        print("\n".join(floor_lines(server.create_database("floor"), args)), flush=True)


if __name__ == "__main__":
    main()
