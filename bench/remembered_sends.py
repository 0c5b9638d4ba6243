"""Sends on PostgreSQL that read their queue first, against sends that go on the queue as the
last send read it (``Store.checks_lookups``: one round trip a send instead of two), beside
the plain pgmq send pattern.

One client sends ``--single`` messages one at a time and ``--batches`` batches of
``--batch``, both ways taking turns (``checks_lookups`` switched off on the store for the
sends that read: the engine then reads the queue for every send, as it did before), and pgmq
sends the same batches after each round. Prints one machine-readable line of medians over
``--rounds``:

    read_single_ms=… remembered_single_ms=… single_speedup=… read_batch_ms=…
    remembered_batch_ms=… pgmq_batch_ms=… read_batch_ratio=… remembered_batch_ratio=…

(a ``…_ratio`` is pgmq's time a batch over poisonq's: above 1, poisonq sends faster).
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import pgmq_pattern
from queue_throughput import store_url

import poisonq
from poisonq import Message


def _time_sends(sender: poisonq.Sender, count: int, batch: int, body: bytes) -> float:
    """Milliseconds a send of ``count`` sends of ``batch`` messages (one message alone for 1)."""
    started = time.perf_counter()
    for _ in range(count):
        sender.send(
            Message(body=body) if batch == 1 else [Message(body=body) for _ in range(batch)]
        )
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a PostgreSQL database (default: a temporary server)")
    parser.add_argument("--single", type=int, default=300, help="single-message sends a turn")
    parser.add_argument("--batches", type=int, default=100, help="batch sends a turn")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    args.postgres = args.url is None
    body = b"x" * args.size
    times: dict[str, list[float]] = {
        k: [] for k in ("read_single", "remembered_single", "read_batch", "remembered_batch")
    }
    pgmq: list[float] = []
    with store_url(args, "") as url, poisonq.connect(url) as broker:
        queue = f"remembered-{time.monotonic_ns()}"
        broker.create_queue(queue)
        sender, store = broker.sender(queue), broker.engine.store
        peer = pgmq_pattern.PgmqQueue(url)
        try:
            for number in range(args.rounds):
                ways = ("read", "remembered") if number % 2 == 0 else ("remembered", "read")
                for way in ways:
                    store.checks_lookups = way == "remembered"  # type: ignore[misc]
                    times[f"{way}_single"].append(_time_sends(sender, args.single, 1, body))
                    times[f"{way}_batch"].append(
                        _time_sends(sender, args.batches, args.batch, body)
                    )
                plain = peer.fresh()
                count = args.batches * args.batch
                pgmq.append(args.batch / plain.send(count, body.decode(), args.batch) * 1e3)
        finally:
            peer.close()
            broker.delete_queue(queue)
    m = {k: median(v) for k, v in times.items()}
    p = median(pgmq)
    print(
        f"read_single_ms={m['read_single']:.3f} remembered_single_ms={m['remembered_single']:.3f}"
        f" single_speedup={m['read_single'] / m['remembered_single']:.2f}"
        f" read_batch_ms={m['read_batch']:.3f} remembered_batch_ms={m['remembered_batch']:.3f}"
        f" pgmq_batch_ms={p:.3f} read_batch_ratio={p / m['read_batch']:.2f}"
        f" remembered_batch_ratio={p / m['remembered_batch']:.2f}"
    )


if __name__ == "__main__":
    main()
