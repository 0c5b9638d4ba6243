"""The CPU under the SQLite queue bench: produce and dead-letter move without the disk.

``queue_throughput.py`` commits durably, so its rates follow the disk and a shared machine's
load. This script runs the same two phases as it (batches of ``--batch`` messages built as
``Message`` objects and sent; a batch received and dead-lettered with ``settle_and_receive``
while the next is locked) on stores with ``synchronous=off``, so that what is timed is the
CPU: poisonq's Python and statements. The minimal queue (``sqlite_pattern.py``) runs beside
it, batch by batch taking turns, and each figure is the median of the batches' times:

    produce_ms=... minimal_produce_ms=... dlq_move_ms=... minimal_dlq_move_ms=...
    ratio_produce=... ratio_dlq_move=...

(milliseconds a batch). A ratio is the minimal queue's time over poisonq's, as the bench's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import sqlite_pattern

import poisonq
from poisonq import DeadLetter, Message


class MinimalSteps:
    """The minimal queue, one batch at a time: a send, or a dead-letter of the batch held
    with the lock of the next one (``MinimalSqliteQueue.drain`` as single steps)."""

    def __init__(self, path: str) -> None:
        self.queue = sqlite_pattern.MinimalSqliteQueue(path).fresh()
        self.queue.db.execute("PRAGMA synchronous = off")
        self.held: list[tuple[int, float]] = []

    def send(self, body: str, batch: int) -> float:
        return batch / self.queue.send(batch, body, batch)

    def dead_letter_step(self, batch: int) -> float:
        db, now = self.queue.db, time.time()
        started = time.perf_counter()
        with db:
            db.execute("BEGIN IMMEDIATE")
            if self.held:
                db.executemany(sqlite_pattern.DEAD_LETTER, self.held)
            until = now + sqlite_pattern.LOCK_SECONDS
            rows = db.execute(sqlite_pattern.LOCK, (until, now, batch)).fetchall()
        self.held = [(row[0], until) for row in rows]
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    body = os.urandom(args.size // 2 + 1).hex()[: args.size]
    data = body.encode()
    with tempfile.TemporaryDirectory() as tmp:
        minimal = MinimalSteps(os.path.join(tmp, "minimal.db"))
        with poisonq.connect(f"sqlite:///{tmp}/cpu.db?synchronous=off") as broker:
            broker.create_queue("cpu")
            sender = broker.sender("cpu")
            send: list[float] = []
            minimal_send: list[float] = []
            for _ in range(args.batches):
                started = time.perf_counter()
                sender.send([Message(body=data) for _ in range(args.batch)])
                send.append(time.perf_counter() - started)
                minimal_send.append(minimal.send(body, args.batch))
            receiver = broker.receiver("cpu")
            move: list[float] = []
            minimal_move = [minimal.dead_letter_step(args.batch)]  # locks its first batch
            messages = receiver.receive(max_messages=args.batch)
            while messages:
                started = time.perf_counter()
                moves = [
                    DeadLetter(m.sequence_number, m.lock_token or "", "Bench", "moved")
                    for m in messages
                ]
                messages = receiver.settle_and_receive(moves, max_messages=args.batch)
                move.append(time.perf_counter() - started)
                minimal_move.append(minimal.dead_letter_step(args.batch))
            assert broker.audit().ok, "the ledger does not balance"
        minimal.queue.close()
    ms = {
        name: statistics.median(times) * 1e3
        for name, times in (
            ("produce", send),
            ("minimal_produce", minimal_send),
            ("dlq_move", move),
            ("minimal_dlq_move", minimal_move),
        )
    }
    print(
        " ".join(f"{name}_ms={value:.3f}" for name, value in ms.items()),
        f"ratio_produce={ms['minimal_produce'] / ms['produce']:.2f}",
        f"ratio_dlq_move={ms['minimal_dlq_move'] / ms['dlq_move']:.2f}",
    )


if __name__ == "__main__":
    main()
