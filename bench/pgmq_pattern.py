"""The plain pgmq SQL pattern, the yardstick for the PostgreSQL store.

pgmq keeps a queue in one table (``msg_id bigserial, read_ct, enqueued_at, vt, message
jsonb``) and runs each operation as one statement in its own transaction: send inserts a
batch, read moves the visibility time of the oldest visible rows (``FOR UPDATE SKIP
LOCKED``), delete removes them, and archive (its dead-letter move) deletes and inserts into an
archive table in one statement. This module runs those statements, as pgmq's functions do,
over one autocommit connection (prepared, as pgmq's functions are), with the same batches as
the queue benchmark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from statistics import median

import psycopg

SCHEMA = """
CREATE TABLE pgmq_q (
    msg_id      bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    read_ct     integer DEFAULT 0 NOT NULL,
    enqueued_at timestamptz DEFAULT now() NOT NULL,
    vt          timestamptz NOT NULL,
    message     jsonb
);
CREATE INDEX pgmq_q_vt ON pgmq_q (vt ASC);
CREATE TABLE pgmq_a (
    msg_id      bigint PRIMARY KEY,
    read_ct     integer DEFAULT 0 NOT NULL,
    enqueued_at timestamptz DEFAULT now() NOT NULL,
    archived_at timestamptz DEFAULT now() NOT NULL,
    vt          timestamptz NOT NULL,
    message     jsonb
);
CREATE INDEX pgmq_a_archived_at ON pgmq_a (archived_at);
"""
SEND = (
    "INSERT INTO pgmq_q (vt, message) SELECT clock_timestamp(), unnest(%s::jsonb[])"
    " RETURNING msg_id"
)
READ = (
    "WITH cte AS (SELECT msg_id FROM pgmq_q WHERE vt <= clock_timestamp() ORDER BY msg_id"
    " LIMIT %s FOR UPDATE SKIP LOCKED)"
    " UPDATE pgmq_q m SET vt = clock_timestamp() + interval '30 seconds',"
    " read_ct = read_ct + 1 FROM cte WHERE m.msg_id = cte.msg_id"
    " RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message"
)
DELETE = "DELETE FROM pgmq_q WHERE msg_id = ANY(%s) RETURNING msg_id"
ARCHIVE = (
    "WITH archived AS (DELETE FROM pgmq_q WHERE msg_id = ANY(%s)"
    " RETURNING msg_id, vt, read_ct, enqueued_at, message)"
    " INSERT INTO pgmq_a (msg_id, vt, read_ct, enqueued_at, message)"
    " SELECT msg_id, vt, read_ct, enqueued_at, message FROM archived RETURNING msg_id"
)


PHASES = ("produce", "consume_complete", "dlq_move")
Rates = dict[str, float]


def beside(
    rates: tuple[Rates, Rates],
    ours_first: bool,
    phase: str,
    mine: Callable[[], float],
    theirs: Callable[[], float],
) -> None:
    """Run one phase for poisonq and for pgmq right after each other, in the order told (so
    that both meet the same load on a shared machine), and keep each one's rate."""
    ours, plain = rates
    if ours_first:
        ours[phase], plain[phase] = mine(), theirs()
    else:
        plain[phase], ours[phase] = theirs(), mine()


def medians(rounds: list[tuple[Rates, Rates]]) -> tuple[Rates, Rates, Rates]:
    """poisonq's and pgmq's median rate per phase over the rounds, and the median of the
    rounds' ratios (pgmq's and the ratios empty when pgmq did not run)."""
    ours_only = {k: median(ours[k] for ours, _ in rounds) for k in PHASES}
    if not rounds[0][1]:
        return ours_only, {}, {}
    return (
        ours_only,
        {k: median(plain[k] for _, plain in rounds) for k in PHASES},
        {k: median(ours[k] / plain[k] for ours, plain in rounds) for k in PHASES},
    )


def rate_fields(prefix: str, rates: Rates) -> str:
    """``{prefix}{phase}_msgs_per_s=…`` for every phase."""
    return " ".join(f"{prefix}{k}_msgs_per_s={v:.0f}" for k, v in rates.items())


def ratio_fields(ratios: Rates) -> str:
    return " ".join(f"ratio_{k}={v:.2f}" for k, v in ratios.items())


class PgmqQueue:
    """One pgmq-style queue on one autocommit connection, with its archive table."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)

    def fresh(self) -> PgmqQueue:
        """Start a round of a comparison from clean tables: pgmq's new, and poisonq's (in the
        same database) vacuumed. Without the vacuum, poisonq's round met the dead rows of the
        last one, and autovacuum working on them beside the measurement (dead-letter ratios of
        0.6 among 0.9s)."""
        self.conn.execute("DROP TABLE IF EXISTS pgmq_q, pgmq_a")
        self.conn.execute(SCHEMA.encode(), prepare=False)
        self.conn.execute("VACUUM (ANALYZE) messages, entities")
        return self

    def send(self, count: int, body: str, batch: int) -> float:
        """Send ``count`` messages in batches; returns messages per second."""
        message = json.dumps({"body": body})
        started = time.perf_counter()
        for start in range(0, count, batch):
            self.conn.execute(SEND, ([message] * min(batch, count - start),)).fetchall()
        return count / (time.perf_counter() - started)

    def drain(self, count: int, batch: int, archive: bool) -> float:
        """Read every message in batches and delete (or archive) each batch."""
        settle = ARCHIVE if archive else DELETE
        done = 0
        started = time.perf_counter()
        while rows := self.conn.execute(READ, (batch,)).fetchall():
            done += len(rows)
            self.conn.execute(settle, ([row[0] for row in rows],)).fetchall()
        if done != count:
            raise SystemExit(f"pgmq: expected {count} messages, read {done}")
        return count / (time.perf_counter() - started)

    def close(self) -> None:
        self.conn.execute("DROP TABLE IF EXISTS pgmq_q, pgmq_a")
        self.conn.close()
