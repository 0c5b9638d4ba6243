"""What bulk work and read-outs cost on a SQLite store that holds a lot.

Bulk work, on ``--dead-letters`` dead-lettered messages (1,000,000 by default), in one run:

- ``dead_letter``: received and dead-lettered through a receiver (``settle_and_receive``,
  batches of 500), the baseline the tasks are measured against;
- ``resubmit``: all of them back to their queue, unthrottled (``rate=None``);
- ``purge``: all of them dropped, after they were dead-lettered again.

Read-outs, with ``--held`` messages held (10,000,000 by default; written straight into the
schema in bulk, with the ledger to match, since sending them through the API would take
minutes): ``Broker.counts`` of the big queue, a ``/metrics`` scrape, the UI overview, and the
dead-letter groups of a queue holding ``--dead-letters`` dead-lettered messages.

Prints two lines: ``dead_letter_msgs_per_s=… resubmit_msgs_per_s=… purge_msgs_per_s=…
resubmit_ratio=… purge_ratio=…`` and ``held=… counts_ms=… metrics_ms=… overview_ms=…
groups_ms=…``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

import poisonq
from poisonq import DeadLetter, Message
from poisonq.server.app import create_app

BODY = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
SEND_BATCH = 10_000
BATCH = 500
TOKEN = "bench-token"


def fill(broker: poisonq.Broker, queue: str, count: int) -> None:
    sender = broker.sender(queue)
    for start in range(0, count, SEND_BATCH):
        sender.send([Message(body=BODY, subject="order")] * min(SEND_BATCH, count - start))


def dead_letter_all(broker: poisonq.Broker, queue: str, count: int) -> float:
    """Dead-letter every message of ``queue`` through a receiver; returns messages/s."""
    receiver = broker.receiver(queue)
    started = time.perf_counter()
    done = 0
    messages = receiver.receive(max_messages=BATCH)
    while messages:
        done += len(messages)
        reasons = ["Invalid" if m.sequence_number % 3 else "Expired" for m in messages]
        moves = [
            DeadLetter(m.sequence_number, m.lock_token or "", reason, "checked by the bench")
            for m, reason in zip(messages, reasons, strict=True)
        ]
        messages = receiver.settle_and_receive(moves, max_messages=BATCH)
    assert done == count, (done, count)
    return count / (time.perf_counter() - started)


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def hold(url: str, path: Path, queue: str, count: int) -> None:
    """Put ``count`` active messages in ``queue`` with bulk SQL, and the ledger to match."""
    import sqlite3

    with poisonq.connect(url) as broker:
        broker.create_queue(queue)
        broker.sender(queue).send(Message(body=BODY))  # the entity's id and a template row
    db = sqlite3.connect(path, isolation_level=None)
    (entity_id,) = db.execute("SELECT id FROM entities WHERE name = ?", (queue,)).fetchone()
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        " INSERT INTO messages (entity_id, state, message_id, body, size, enqueued_at)"
        " SELECT ?, 'active', 'bulk-' || i, ?, ?, 0 FROM n",
        (count - 1, entity_id, BODY, len(BODY)),
    )
    db.execute(
        "UPDATE entities SET sent = sent + ?, size_bytes = size_bytes + ? WHERE id = ?",
        (count - 1, (count - 1) * len(BODY), entity_id),
    )
    db.execute("COMMIT")
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead-letters", type=int, default=1_000_000)
    parser.add_argument("--held", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5, help="of each read-out (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "held.db"
        url = f"sqlite:///{path}"
        hold(url, path, "big", args.held)
        with poisonq.connect(url) as broker:
            broker.create_queue("orders", max_delivery_count=3)
            fill(broker, "orders", args.dead_letters)
            moved = dead_letter_all(broker, "orders", args.dead_letters)
            seconds = timed(lambda: broker.resubmit("orders", rate=None))
            resubmit = args.dead_letters / seconds
            dead_letter_all(broker, "orders", args.dead_letters)
            purge = args.dead_letters / timed(lambda: broker.purge("orders"))
            fill(broker, "orders", args.dead_letters)
            dead_letter_all(broker, "orders", args.dead_letters)
            assert broker.audit().ok
            client = TestClient(create_app(broker, token=TOKEN, open_reads=True))
            reads = {
                "counts": lambda: broker.counts("big"),
                "metrics": lambda: client.get("/metrics").raise_for_status(),
                "overview": lambda: client.get("/ui/").raise_for_status(),
                "groups": lambda: broker.dead_letter_groups("orders", by="reason"),
            }
            costs = {
                name: statistics.median(timed(read) for _ in range(args.repeats)) * 1e3
                for name, read in reads.items()
            }
        print(
            f"dead_letter_msgs_per_s={moved:.0f} resubmit_msgs_per_s={resubmit:.0f}"
            f" purge_msgs_per_s={purge:.0f} resubmit_ratio={resubmit / moved:.2f}"
            f" purge_ratio={purge / moved:.2f}"
        )
        print(
            f"held={args.held + 2 * args.dead_letters}"
            + "".join(f" {name}_ms={ms:.1f}" for name, ms in costs.items())
        )


if __name__ == "__main__":
    main()
