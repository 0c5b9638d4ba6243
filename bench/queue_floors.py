"""The floor under the PostgreSQL store's speed: poisonq's own schema with bare SQL, beside pgmq.

``queue_throughput.py --postgres`` compares the store with the plain pgmq SQL pattern. This
script asks what the store could reach at best on the same server: each phase as the fewest
statements that do what poisonq must do per batch, with nothing else in the way (no entity
look-up, no lock sweep, no ledger, no Python objects; psycopg's rows as they come):

- produce: one ``INSERT … SELECT … unnest`` of the batch, committed (one round trip);
- consume: complete the previous batch (``DELETE``, guarded by its lock token) and lock the
  next one (``UPDATE … RETURNING`` the message columns a receiver gets) in one transaction,
  one round trip, as ``complete_and_receive`` does;
- dead-letter: move the previous batch to the dead-letter queue (``UPDATE`` of its entity and
  state) and lock the next one, one transaction, one round trip.

pgmq runs beside it as in the queue benchmark (same server, batches, body; rounds taking turns
to go first; medians). Prints one line:

    floor_produce_msgs_per_s=… floor_consume_complete_msgs_per_s=… floor_dlq_move_msgs_per_s=…
    pgmq_…=… ratio_produce=… ratio_consume_complete=… ratio_dlq_move=…

A ratio here is the most the store can gain over pgmq by cutting its own overhead: its
statements already do what they must, and this is all they do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pgmq_pattern
import psycopg

import poisonq
from poisonq.model import SubQueue
from poisonq.names import subqueue_name
from poisonq.store.postgres.transaction import _MESSAGE_COLUMNS
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
            ids = [uuid.uuid4().hex for _ in range(n)]
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

    def close(self) -> None:
        self.conn.close()


def _round(
    broker: poisonq.Broker,
    floor: Floor,
    pgmq: pgmq_pattern.PgmqQueue,
    args: argparse.Namespace,
    first: bool,
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    """One run of every phase on a new queue (made and deleted through the client, so the
    bare statements never leave anything behind), each phase beside pgmq's."""
    queue = f"floor-{os.getpid()}-{time.monotonic_ns()}"
    broker.create_queue(queue)
    try:
        return _phases(queue, floor, pgmq.fresh(), args, first)
    finally:
        broker.delete_queue(queue)


def _phases(
    queue: str, floor: Floor, plain: pgmq_pattern.PgmqQueue, args: argparse.Namespace, first: bool
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    body = os.urandom(args.size // 2 + 1).hex()[: args.size]
    with floor.conn.cursor() as cur:
        rows = cur.execute(
            "SELECT id, name FROM entities WHERE name = %s OR name = %s",
            (queue, subqueue_name(queue, SubQueue.DEADLETTER)),
        ).fetchall()
    ids = {name: entity_id for entity_id, name in rows}
    main, dlq = ids[queue], ids[subqueue_name(queue, SubQueue.DEADLETTER)]
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
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(TemporaryServer()).create_database("floor")
        broker = stack.enter_context(poisonq.connect(url))  # creates the schema if need be
        floor, pgmq = Floor(url), pgmq_pattern.PgmqQueue(url)
        stack.callback(floor.close)
        stack.callback(pgmq.close)
        rounds = [_round(broker, floor, pgmq, args, n % 2 == 0) for n in range(args.rounds)]
    rates, plain, ratios = pgmq_pattern.medians(rounds)
    print(
        f"{pgmq_pattern.rate_fields('floor_', rates)} {pgmq_pattern.rate_fields('pgmq_', plain)}"
        f" {pgmq_pattern.ratio_fields(ratios)}"
    )


if __name__ == "__main__":
    main()
