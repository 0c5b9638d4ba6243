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

With ``--sqlite`` the floor is also measured for schemas the store does not have, each made
from today's in a store file of its own (``--design``, default all; a line each, starting
``design=…``): ``today``; ``in-place`` (a dead-lettered message keeps its queue's entity and
only its state and reason change, the reason and fingerprint indexes partial on
``state = 'dead_lettered'``); ``…-state-index`` (without the reason and fingerprint indexes);
``today-range`` (today's schema, a receive taking its batch as a lease's range). Every design
counts a moved batch into the dead-letter aggregates by one grouped statement, as the store
does since schema 18 (the designs counted by row triggers went with them). Each
design runs every phase beside a run of the minimal queue of its own. ``--synchronous OFF``
leaves the disk's wait out of both sides.
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
from dataclasses import dataclass
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
# A batch's rows found by their numbers, as the store finds them (not by walking the index the
# statement changes, which makes SQLite collect the rows before it writes them).
SQLITE_GUARD = f"+entity_id = ? AND +state = 'locked' AND lock_token = ? AND seq IN {SEQS}"
# A receive by range, as the store's leases take their batches: the ready messages above the
# entity's covers read, and held by one row of leases (its cover), none of them written.
SQLITE_READY = (
    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE entity_id = ?1 AND state = 'active'"
    " AND seq > coalesce((SELECT max(cover_hi) FROM leases WHERE entity_id = ?1"
    " AND cover_lo IS NOT NULL), 0) ORDER BY seq LIMIT ?2"
)
SQLITE_LEASE = (
    "INSERT INTO leases (entity_id, consumer, number, lock_token, count, min_seq, max_seq,"
    " created_at, locked_until, cover_lo, cover_hi) VALUES (?, ?2, 1, ?2, ?, ?, ?, ?, ?, ?, ?)"
)
# Its settlement: the cover let go if its lock holds, its range then settled.
SQLITE_RELEASE = (
    "DELETE FROM leases WHERE entity_id = ? AND consumer = ? AND locked_until > ?"
    " RETURNING cover_lo, cover_hi"
)
# A moved batch counted into its dead-letter queue's aggregates by one statement, grouped as
# schema 12 keys a message, as the store counts it (schema 18).
SQLITE_COUNT = (
    "INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type,"
    " bucket, count, first_at, last_at)"
    " SELECT entity_id, json_quote(dead_letter_reason), json_quote(subject),"
    " json_quote(last_fingerprint), json_quote(last_error_type),"
    " CAST(dead_lettered_at / 3600 AS INTEGER) * 3600, count(*), min(dead_lettered_at),"
    " max(dead_lettered_at) FROM messages WHERE {which} GROUP BY 1, 2, 3, 4, 5, 6"
    " ON CONFLICT DO UPDATE SET count = count + excluded.count,"
    " first_at = min(first_at, excluded.first_at), last_at = max(last_at, excluded.last_at)"
)


@dataclass(frozen=True)
class Design:
    """Where a dead-lettered message lives, and what its move writes besides its row.

    ``in_place``: it keeps its queue's entity and only its state (and reason) change, the
    dead-letter queue read as (queue, ``'dead_lettered'``); the reason and fingerprint indexes
    then hold dead-lettered messages only (partial on the state). Else (today's schema) it
    moves to its dead-letter queue's entity. ``reason_index``: without it (nor the
    fingerprint's), a dead-lettered message has an entry in ``messages_by_state`` alone.
    ``range_receive``: a receive holds its batch as one row of ``leases`` (a cover of its
    range, as the store's leases do) instead of writing a lock into each message, and its
    settlement counts the delivery in each message's row.
    """

    name: str
    in_place: bool = False
    reason_index: bool = True
    range_receive: bool = False

    def apply(self, db: sqlite3.Connection) -> None:
        """Turn today's schema (made by the store in ``db``) into this design's."""
        if self.in_place or not self.reason_index:
            db.execute("DROP INDEX messages_by_dead_letter_reason")
            db.execute("DROP INDEX messages_by_fingerprint")
        if self.in_place and self.reason_index:
            db.execute(
                "CREATE INDEX messages_by_dead_letter_reason ON messages"
                " (entity_id, dead_letter_reason, seq) WHERE state = 'dead_lettered'"
            )
            db.execute(
                "CREATE INDEX messages_by_fingerprint ON messages"
                " (entity_id, last_fingerprint, seq)"
                " WHERE state = 'dead_lettered' AND last_fingerprint IS NOT NULL"
            )


DESIGNS = {
    design.name: design
    for design in (
        Design("today"),
        Design("today-state-index", reason_index=False),
        Design("in-place", in_place=True),
        Design("in-place-state-index", in_place=True, reason_index=False),
        Design("today-range", range_receive=True),
    )
}


class SqliteFloor:
    """poisonq's SQLite schema (or a design of its dead-letter queue over it) on one
    connection with the store's durability, each batch in one transaction."""

    def __init__(self, path: str, design: Design, synchronous: str = "FULL") -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute(f"PRAGMA synchronous = {synchronous}")
        self.design = design
        design.apply(self.db)

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
                rows = self._lock(entity, token, now, batch)
            if not rows:
                break
            done += len(rows)
            held = (token, json.dumps([row[0] for row in rows]))
        if done != count:
            raise SystemExit(f"floor: expected {count} messages, locked {done}")
        return count / (time.perf_counter() - started)

    def _lock(self, entity: int, token: str, now: float, batch: int) -> list[Any]:
        if not self.design.range_receive:
            return self.db.execute(SQLITE_LOCK, (token, now + 30, entity, batch)).fetchall()
        rows = self.db.execute(SQLITE_READY, (entity, batch)).fetchall()
        if rows:
            lo, hi = rows[0][0], rows[-1][0]
            self.db.execute(SQLITE_LEASE, (entity, token, len(rows), lo, hi, now, now + 30, lo, hi))
        return rows

    def _settle(
        self, entity: int, token: str, seqs: str, dead_letter: int | None, now: float
    ) -> None:
        which, params, delivered = SQLITE_GUARD, (entity, token, seqs), ""
        batch: tuple[str, tuple[object, ...]] = (f"seq IN {SEQS}", (seqs,))  # (to count)
        if self.design.range_receive:  # the lease's range; each delivery counted as it leaves
            lo, hi = self.db.execute(SQLITE_RELEASE, (entity, token, now)).fetchone()
            which = "+entity_id = ? AND +state = 'active' AND seq BETWEEN ? AND ?"
            params, batch = (entity, lo, hi), ("seq BETWEEN ? AND ?", (lo, hi))
            delivered = " delivery_count = delivery_count + 1,"
        if dead_letter is None:
            self.db.execute(f"DELETE FROM messages WHERE {which}", params)
            return
        move, moved = "entity_id = ?,", (dead_letter,)
        if self.design.in_place:
            move, moved = "", ()
        self.db.execute(
            f"UPDATE messages SET {move}{delivered} state = 'dead_lettered', lock_token = NULL,"
            " locked_until = NULL, dead_letter_reason = 'Bench', dead_lettered_at = ?"
            f" WHERE {which}",
            (*moved, now, *params),
        )
        self.db.execute(SQLITE_COUNT.format(which=batch[0]), batch[1])

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
    parser.add_argument(
        "--design",
        action="append",
        choices=DESIGNS,
        help="with --sqlite, a design of the dead-letter queue to measure (repeat; default: all)",
    )
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "OFF"),
        default="FULL",
        help="with --sqlite, OFF leaves out the disk's wait (floor and peer): the CPU's floor",
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.sqlite:
        _sqlite(args, [DESIGNS[name] for name in args.design or DESIGNS])
        return
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(TemporaryServer()).create_database("floor")
        broker = stack.enter_context(poisonq.connect(url))  # creates the schema if need be
        floor, peer = Floor(url), pgmq_pattern.PgmqQueue(url)
        stack.callback(floor.close)
        stack.callback(peer.close)
        rounds = [_round(broker, floor, peer, args, n % 2 == 0) for n in range(args.rounds)]
    print(_line(rounds, "pgmq_"))


def _sqlite(args: argparse.Namespace, designs: list[Design]) -> None:
    """Every design in a store file of its own, each round running them all in turn (their
    order turning round by round), each beside a run of the minimal queue; a line a design."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        peer = sqlite_pattern.MinimalSqliteQueue(os.path.join(tmp, "minimal.db"))
        peer.db.execute(f"PRAGMA synchronous = {args.synchronous}")
        stack.callback(peer.close)
        stores: list[tuple[poisonq.Broker, SqliteFloor]] = []
        for design in designs:
            path = os.path.join(tmp, f"{design.name}.db")
            broker = stack.enter_context(poisonq.connect(f"sqlite:///{path}"))
            floor = SqliteFloor(path, design, args.synchronous)
            stack.callback(floor.close)
            stores.append((broker, floor))
        rounds: list[list[tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]]] = [[] for _ in stores]
        for n in range(args.rounds):
            for i in [(n + k) % len(stores) for k in range(len(stores))]:
                rounds[i].append(_round(*stores[i], peer, args, n % 2 == 0))
    for design, results in zip(designs, rounds, strict=True):
        print(f"design={design.name} {_line(results, 'minimal_sqlite_')}")


def _line(rounds: list[tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]], prefix: str) -> str:
    """The medians of the rounds: the floor's rates, the peer's, their ratios."""
    rates, plain, ratios = pgmq_pattern.medians(rounds)
    return (
        f"{pgmq_pattern.rate_fields('floor_', rates)} {pgmq_pattern.rate_fields(prefix, plain)}"
        f" {pgmq_pattern.ratio_fields(ratios)}"
    )


if __name__ == "__main__":
    main()
