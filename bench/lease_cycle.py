"""What a pipeline batch costs the store: take a lease of ``--messages`` messages, read its
rows as the executors do, and complete it, against two bare-SQL floors in the same run.

- ``poisonq``: :meth:`Broker.acquire_lease`, :meth:`Broker.lease_rows`,
  :meth:`Broker.complete_lease` on a SQLite store (WAL, ``synchronous=FULL``), or with
  ``--postgres`` on a temporary PostgreSQL server (``--url`` names another store).
- ``row_locks``: the least a lease of per-message locks can cost: lock every message with
  one UPDATE, read the rows, delete them.
- ``range``: the least a lease by range can cost: insert one lease row, read the rows, delete
  them.

Both floors use one table of messages, each body in its row, as the store does (schema 15),
and the same bodies. Prints one line: ``lease_cycle_us_per_msg=… row_locks_floor_us_per_msg=…
range_floor_us_per_msg=… ratio_to_range_floor=…`` (the floor's time over ours: 1.0 would be
the floor itself). The floors are SQLite's: on another store the line is ``store=postgresql
lease_cycle_us_per_msg=…`` alone.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from queue_throughput import store_url

import poisonq

BODY = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
SEND_BATCH = 10_000


def poisonq_cycle(url: str, queue: str, count: int) -> float:
    with poisonq.connect(url) as broker:
        broker.create_queue(queue, lock_duration=300)
        sender = broker.sender(queue)
        for start in range(0, count, SEND_BATCH):
            sender.send([poisonq.Message(body=BODY)] * min(SEND_BATCH, count - start))
        started = time.perf_counter()
        lease = broker.acquire_lease(queue, "bench", 1, count)
        assert lease is not None and lease.count == count
        assert len(broker.lease_rows(lease)) == count
        assert broker.complete_lease(lease) == count
        return time.perf_counter() - started


def sqlite_cycle(work: Path, count: int) -> float:
    return poisonq_cycle(f"sqlite:///{work / 'poisonq.db'}", "orders", count)


def _bare(work: Path, count: int, name: str) -> sqlite3.Connection:
    db = sqlite3.connect(work / f"{name}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(
        "CREATE TABLE messages (seq INTEGER PRIMARY KEY, entity_id INTEGER NOT NULL,"
        " state TEXT NOT NULL, lock_token TEXT, locked_until REAL,"
        " delivery_count INTEGER NOT NULL DEFAULT 0, body BLOB NOT NULL);"
        "CREATE INDEX messages_by_state ON messages (entity_id, state, seq);"
        "CREATE TABLE leases (token TEXT, lo INTEGER, hi INTEGER, locked_until REAL);"
    )
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO messages (entity_id, state, body) VALUES (1, 'active', ?)",
        ((BODY,) for _ in range(count)),
    )
    db.execute("COMMIT")
    return db


def _read_and_delete(db: sqlite3.Connection, where: str, count: int) -> None:
    rows = db.execute(
        f"SELECT seq, body FROM messages WHERE entity_id = 1 AND {where} ORDER BY seq"
    ).fetchall()
    assert len(rows) == count
    db.execute("BEGIN IMMEDIATE")
    db.execute(f"DELETE FROM messages WHERE {where}")
    db.execute("COMMIT")


def row_locks_floor(work: Path, count: int) -> float:
    db = _bare(work, count, "row_locks")
    started = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "UPDATE messages SET state = 'locked', lock_token = 't', locked_until = 1e12,"
        " delivery_count = delivery_count + 1 WHERE seq IN (SELECT seq FROM messages"
        " WHERE entity_id = 1 AND state = 'active' ORDER BY seq LIMIT ?)",
        (count,),
    )
    db.execute("COMMIT")
    _read_and_delete(db, "state = 'locked' AND lock_token = 't'", count)
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def range_floor(work: Path, count: int) -> float:
    db = _bare(work, count, "range")
    started = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    lo, hi = db.execute(
        "SELECT min(seq), max(seq) FROM (SELECT seq FROM messages WHERE entity_id = 1"
        " AND state = 'active' ORDER BY seq LIMIT ?)",
        (count,),
    ).fetchone()
    db.execute("INSERT INTO leases VALUES ('t', ?, ?, 1e12)", (lo, hi))
    db.execute("COMMIT")
    _read_and_delete(db, f"state = 'active' AND seq BETWEEN {lo} AND {hi}", count)
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def median_us(run: Callable[[Path, int], float], count: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as work:
            times.append(run(Path(work), count))
    return statistics.median(times) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", help="store URL (default: a fresh SQLite file)")
    parser.add_argument(
        "--postgres", action="store_true", help="start a temporary PostgreSQL server and use it"
    )
    args = parser.parse_args()
    if not (args.url or args.postgres):  # a fresh SQLite file for each run, as the floors
        ours = median_us(sqlite_cycle, args.messages, args.repeats)
    else:
        with tempfile.TemporaryDirectory() as tmp, store_url(args, tmp) as url:
            # A queue of its own for each run: the store is one for all of them.
            times = [poisonq_cycle(url, f"orders{n}", args.messages) for n in range(args.repeats)]
        ours = statistics.median(times) / args.messages * 1e6
        print(f"store={url.split(':', 1)[0]} lease_cycle_us_per_msg={ours:.2f}")
        return
    row_locks = median_us(row_locks_floor, args.messages, args.repeats)
    ranged = median_us(range_floor, args.messages, args.repeats)
    print(
        f"lease_cycle_us_per_msg={ours:.2f} row_locks_floor_us_per_msg={row_locks:.2f}"
        f" range_floor_us_per_msg={ranged:.2f} ratio_to_range_floor={ranged / ours:.2f}"
    )


if __name__ == "__main__":
    main()
