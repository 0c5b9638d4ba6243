"""The floor under the store's speed: poisonq's own schema with bare SQL, beside its peer.

``queue_throughput.py`` compares the store with a peer: the plain pgmq SQL pattern on
PostgreSQL, a minimal hand-written queue on SQLite (``--sqlite``). This script asks what the
store could reach at best on the same server or disk: each phase as the fewest statements that
do what poisonq must do per batch, with nothing else in the way (no entity look-up, no lock
sweep, no ledger, no Python objects; the driver's rows as they come). On PostgreSQL:

- produce: one ``INSERT … SELECT … unnest`` of the batch, committed (one round trip);
- consume: complete the previous batch (``DELETE``, guarded by its lock token) and lock the
  next one (``UPDATE … RETURNING`` the message columns a receiver gets) in one transaction,
  one round trip, as ``complete_and_receive`` does;
- dead-letter: move the previous batch to the dead-letter queue (``UPDATE`` of its entity and
  state) and lock the next one, one transaction, one round trip.

On SQLite the same, in one ``BEGIN IMMEDIATE`` transaction a batch: a send inserts its messages,
each body in its row (one multi-row ``INSERT``, as the store does); completing a batch deletes
its messages.

The peer runs beside it as in the queue benchmark (same server, batches, body; rounds taking turns
to go first; medians). Prints one line:

    floor_produce_msgs_per_s=… floor_consume_complete_msgs_per_s=… floor_dlq_move_msgs_per_s=…
    pgmq_…=… ratio_produce=… ratio_consume_complete=… ratio_dlq_move=…

(``minimal_sqlite_…`` for the peer with ``--sqlite``). A ratio here is the most the store can
gain over its peer by cutting its own overhead: its statements already do what they must, and
this is all they do; below it, only a change of schema helps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pgmq_pattern
import psycopg
import sqlite_pattern

import poisonq
from poisonq.model import SubQueue, new_uuid
from poisonq.names import subqueue_name
from poisonq.store.postgres.transaction import _MESSAGE_COLUMNS
from poisonq.store.sqlite_rows import MESSAGE_COLUMNS, SEQS
from poisonq.testing.pgserver import TemporaryServer

INSERT = (
    "INSERT INTO messages (entity_id, enqueued_at, state, message_id, body, size)"
    " SELECT %b, %b, 'active', unnest(%b::text[]), unnest(%b::bytea[]), %b"
    " RETURNING seq"
)
LOCK = (
    "UPDATE messages SET state = 'locked', lock_token = %(token)b, locked_until = %(until)b,"
    " delivery_count = delivery_count + 1 WHERE seq = ANY(ARRAY(SELECT seq FROM messages"
    " WHERE (entity_id, state, seq) > (%(e)b, 'active', 0)"
    " AND (entity_id, state, seq) < (%(e)b, 'active', 9223372036854775807)"
    " ORDER BY entity_id, state, seq LIMIT %(limit)b FOR UPDATE SKIP LOCKED))"
    f" RETURNING {_MESSAGE_COLUMNS}"
)
COMPLETE = (
    "DELETE FROM messages WHERE entity_id = %b AND state = 'locked' AND lock_token = %b"
    " AND locked_until > %b AND seq = ANY(%b) RETURNING seq"
)
DEAD_LETTER = (
    "UPDATE messages SET entity_id = %b, state = 'dead_lettered', lock_token = NULL,"
    " locked_until = NULL, dead_letter_reason = 'Bench', dead_lettered_at = %b"
    " WHERE entity_id = %b AND state = 'locked' AND lock_token = %b AND locked_until > %b"
    " AND seq = ANY(%b) RETURNING seq"
)


class Floor:
    """poisonq's schema on one autocommit connection, each batch in one pipelined round trip."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)

    def _transaction(self, *statements: tuple[str, Any]) -> list[list[tuple[Any, ...]]]:
        with self.conn.pipeline():
            self.conn.execute("BEGIN")
            cursors = [self.conn.execute(sql, params, binary=True) for sql, params in statements]
            self.conn.execute("COMMIT")
        return [cursor.fetchall() if cursor.description else [] for cursor in cursors]

    def send(self, entity: int, count: int, body: bytes, batch: int) -> float:
        started = time.perf_counter()
        for start in range(0, count, batch):
            n = min(batch, count - start)
            ids = [new_uuid() for _ in range(n)]
            self._transaction((INSERT, (entity, time.time(), ids, [body] * n, len(body))))
        return count / (time.perf_counter() - started)

    def drain(self, entity: int, count: int, batch: int, dead_letter: int | None) -> float:
        done = 0
        started = time.perf_counter()
        settle: tuple[str, Any] | None = None
        while True:
            now, token = time.time(), str(uuid.uuid4())
            lock = (LOCK, {"token": token, "until": now + 30, "e": entity, "limit": batch})
            results = self._transaction(*([settle] if settle else []), lock)
            rows = results[-1]
            if not rows:
                break
            done += len(rows)
            seqs = [row[0] for row in rows]
            settle = (
                (COMPLETE, (entity, token, now, seqs))
                if dead_letter is None
                else (DEAD_LETTER, (dead_letter, now, entity, token, now, seqs))
            )
        if done != count:
            raise SystemExit(f"floor: expected {count} messages, locked {done}")
        return count / (time.perf_counter() - started)

    def entity_ids(self, *names: str) -> list[int]:
        with self.conn.cursor() as cur:
            rows = cur.execute("SELECT name, id FROM entities WHERE name = ANY(%s)", (list(names),))
            ids = dict(rows.fetchall())
        return [ids[name] for name in names]

    def close(self) -> None:
        self.conn.close()


SQLITE_LOCK = (
    "UPDATE messages SET state = 'locked', lock_token = ?, locked_until = ?,"
    " delivery_count = delivery_count + 1 WHERE seq IN (SELECT seq FROM messages"
    " WHERE entity_id = ? AND state = 'active' ORDER BY seq LIMIT ?)"
    f" RETURNING {MESSAGE_COLUMNS}"
)
SQLITE_GUARD = f"entity_id = ? AND state = 'locked' AND lock_token = ? AND seq IN {SEQS}"


class SqliteFloor:
    """poisonq's SQLite schema on one connection with the store's durability, each batch in
    one transaction."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")

    def send(self, entity: int, count: int, body: bytes, batch: int) -> float:
        started = time.perf_counter()
        for start in range(0, count, batch):
            n = min(batch, count - start)
            now = time.time()
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                params: list[Any] = []
                for _ in range(n):
                    params += (entity, now, new_uuid(), body, len(body))
                self.db.execute(
                    "INSERT INTO messages (entity_id, enqueued_at, state, message_id, body,"
                    " size) VALUES " + ", ".join(["(?, ?, 'active', ?, ?, ?)"] * n),
                    params,
                )
        return count / (time.perf_counter() - started)

    def drain(self, entity: int, count: int, batch: int, dead_letter: int | None) -> float:
        done = 0
        started = time.perf_counter()
        held: tuple[str, str] | None = None  # (token, seqs) of the batch to settle
        while True:
            now, token = time.time(), str(uuid.uuid4())
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                if held is not None:
                    self._settle(entity, *held, dead_letter, now)
                rows = self.db.execute(SQLITE_LOCK, (token, now + 30, entity, batch)).fetchall()
            if not rows:
                break
            done += len(rows)
            held = (token, json.dumps([row[0] for row in rows]))
        if done != count:
            raise SystemExit(f"floor: expected {count} messages, locked {done}")
        return count / (time.perf_counter() - started)

    def _settle(
        self, entity: int, token: str, seqs: str, dead_letter: int | None, now: float
    ) -> None:
        if dead_letter is not None:
            self.db.execute(
                "UPDATE messages SET entity_id = ?, state = 'dead_lettered', lock_token = NULL,"
                " locked_until = NULL, dead_letter_reason = 'Bench', dead_lettered_at = ?"
                f" WHERE {SQLITE_GUARD}",
                (dead_letter, now, entity, token, seqs),
            )
            return
        self.db.execute(f"DELETE FROM messages WHERE {SQLITE_GUARD}", (entity, token, seqs))

    def entity_ids(self, *names: str) -> list[int]:
        rows = self.db.execute(
            f"SELECT name, id FROM entities WHERE name IN {SEQS}", (json.dumps(names),)
        )
        ids = dict(rows.fetchall())
        return [ids[name] for name in names]

    def close(self) -> None:
        self.db.close()


Peer = pgmq_pattern.PgmqQueue | sqlite_pattern.MinimalSqliteQueue


def _round(
    broker: poisonq.Broker,
    floor: Floor | SqliteFloor,
    peer: Peer,
    args: argparse.Namespace,
    first: bool,
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    """One run of every phase on a new queue (made and deleted through the client, so the
    bare statements never leave anything behind), each phase beside the peer's."""
    queue = f"floor-{os.getpid()}-{time.monotonic_ns()}"
    broker.create_queue(queue)
    try:
        return _phases(queue, floor, peer.fresh(), args, first)
    finally:
        broker.delete_queue(queue)


def _phases(
    queue: str, floor: Floor | SqliteFloor, plain: Peer, args: argparse.Namespace, first: bool
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    body = os.urandom(args.size // 2 + 1).hex()[: args.size]
    main, dlq = floor.entity_ids(queue, subqueue_name(queue, SubQueue.DEADLETTER))
    ours: pgmq_pattern.Rates = {}
    theirs: pgmq_pattern.Rates = {}

    def both(phase: str, mine: Callable[[], float], other: Callable[[], float]) -> None:
        pgmq_pattern.beside((ours, theirs), first, phase, mine, other)

    n, b = args.messages, args.batch
    both(
        "produce",
        lambda: floor.send(main, n, body.encode(), b),
        lambda: plain.send(n, body, b),
    )
    both(
        "consume_complete",
        lambda: floor.drain(main, n, b, None),
        lambda: plain.drain(n, b, archive=False),
    )
    floor.send(main, args.dead_letter, body.encode(), b)
    plain.send(args.dead_letter, body, b)
    both(
        "dlq_move",
        lambda: floor.drain(main, args.dead_letter, b, dlq),
        lambda: plain.drain(args.dead_letter, b, archive=True),
    )
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a PostgreSQL database (default: a temporary server)")
    parser.add_argument(
        "--sqlite", action="store_true", help="SQLite (temporary files) beside the minimal queue"
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        floor: Floor | SqliteFloor
        peer: Peer
        if args.sqlite:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            path = os.path.join(tmp, "floor.db")
            broker = stack.enter_context(poisonq.connect(f"sqlite:///{path}"))
            floor = SqliteFloor(path)
            peer = sqlite_pattern.MinimalSqliteQueue(os.path.join(tmp, "minimal.db"))
            prefix = "minimal_sqlite_"
        else:
            url = args.url or stack.enter_context(TemporaryServer()).create_database("floor")
            broker = stack.enter_context(poisonq.connect(url))  # creates the schema if need be
            floor, peer, prefix = Floor(url), pgmq_pattern.PgmqQueue(url), "pgmq_"
        stack.callback(floor.close)
        stack.callback(peer.close)
        rounds = [_round(broker, floor, peer, args, n % 2 == 0) for n in range(args.rounds)]
    rates, plain, ratios = pgmq_pattern.medians(rounds)
    print(
        f"{pgmq_pattern.rate_fields('floor_', rates)} {pgmq_pattern.rate_fields(prefix, plain)}"
        f" {pgmq_pattern.ratio_fields(ratios)}"
    )


if __name__ == "__main__":
    main()
