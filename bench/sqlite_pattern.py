"""A minimal hand-written SQLite queue, the yardstick for the SQLite store.

One table (``id, state, vt, read_ct, enqueued_at, body``), the store's durability (WAL,
``synchronous=FULL``), and each operation as the fewest statements a durable queue needs:
send inserts a batch in one transaction; a consumer settles its last batch (deletes it, or
marks it dead-lettered) and locks the next one (moves its visibility time and counts a read,
``RETURNING`` the rows) in one transaction, as poisonq's ``complete_and_receive`` does. It
has what poisonq's SQLite store must have at least, and nothing else (no entities, no
failure history, no ledger), so poisonq's ratio to it is what its features cost.
"""

from __future__ import annotations

import sqlite3
import time

SCHEMA = """
CREATE TABLE q (
    id          INTEGER PRIMARY KEY,
    state       INTEGER NOT NULL DEFAULT 0,  -- 0 ready, 1 dead-lettered
    vt          REAL NOT NULL,
    read_ct     INTEGER NOT NULL DEFAULT 0,
    enqueued_at REAL NOT NULL,
    body        BLOB NOT NULL
);
CREATE INDEX q_ready ON q (state, vt, id);
"""
SEND = "INSERT INTO q (vt, enqueued_at, body) VALUES (?, ?, ?)"
LOCK = (
    "UPDATE q SET vt = ?, read_ct = read_ct + 1 WHERE id IN"
    " (SELECT id FROM q WHERE state = 0 AND vt <= ? ORDER BY id LIMIT ?)"
    " RETURNING id, read_ct, enqueued_at, body"
)
DELETE = "DELETE FROM q WHERE id = ? AND vt = ?"
DEAD_LETTER = "UPDATE q SET state = 1 WHERE id = ? AND vt = ?"
LOCK_SECONDS = 30.0


class MinimalSqliteQueue:
    """One queue in its own SQLite file, with the store's durability."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")

    def fresh(self) -> MinimalSqliteQueue:
        """Start a round from an empty table."""
        self.db.execute("DROP TABLE IF EXISTS q")
        self.db.executescript(SCHEMA)
        return self

    def send(self, count: int, body: str, batch: int) -> float:
        """Send ``count`` messages in batches, a transaction each; returns messages per second."""
        data = body.encode()
        started = time.perf_counter()
        for start in range(0, count, batch):
            now = time.time()
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.executemany(SEND, [(now, now, data)] * min(batch, count - start))
        return count / (time.perf_counter() - started)

    def drain(self, count: int, batch: int, archive: bool) -> float:
        """Lock every message in batches, settling each batch (delete, or dead-letter) in
        the transaction that locks the next."""
        settle = DEAD_LETTER if archive else DELETE
        done = 0
        held: list[tuple[int, float]] = []
        started = time.perf_counter()
        while True:
            now = time.time()
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                if held:
                    self.db.executemany(settle, held)
                until = now + LOCK_SECONDS
                rows = self.db.execute(LOCK, (until, now, batch)).fetchall()
            held = [(row[0], until) for row in rows]
            if not rows:
                break
            done += len(rows)
        if done != count:
            raise SystemExit(f"minimal SQLite queue: expected {count} messages, read {done}")
        return count / (time.perf_counter() - started)

    def close(self) -> None:
        self.db.close()
