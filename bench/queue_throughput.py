"""Queue throughput: produce, consume+complete, and dead-letter moves, durably.

Sends ``--messages`` messages of ``--size`` bytes in batches of ``--batch``, receives and
completes them in batches, then sends ``--dead-letter`` more and dead-letters them as they are
received. Prints one machine-readable line:

    store=sqlite produce_msgs_per_s=... consume_complete_msgs_per_s=... dlq_move_msgs_per_s=...
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import poisonq
from poisonq import Message


def _send(broker: poisonq.Broker, queue: str, count: int, size: int, batch: int) -> float:
    body = os.urandom(size // 2).hex().encode()[:size]
    sender = broker.sender(queue)
    started = time.perf_counter()
    for start in range(0, count, batch):
        sender.send([Message(body=body) for _ in range(min(batch, count - start))])
    return count / (time.perf_counter() - started)


def _drain(broker: poisonq.Broker, queue: str, count: int, batch: int, dead_letter: bool) -> float:
    """Receive ``count`` messages in batches and complete (or dead-letter) them. Completion
    of one batch shares a transaction with receiving the next, as a consumer loop would."""
    receiver = broker.receiver(queue)
    done = 0
    started = time.perf_counter()
    messages = receiver.receive(max_messages=batch)
    while messages:
        done += len(messages)
        if dead_letter:
            receiver.dead_letter(messages, reason="Bench", description="moved by the benchmark")
            messages = receiver.receive(max_messages=batch)
        else:
            messages = receiver.complete_and_receive(messages, max_messages=batch)
    if done != count:
        raise SystemExit(f"expected {count} messages, received {done}")
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="store URL (default: a fresh SQLite file, synchronous=FULL)")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{tmp}/bench.db"
        with poisonq.connect(url) as broker:
            queue = f"bench-{os.getpid()}-{int(time.time())}"
            broker.create_queue(queue)
            try:
                produce = _send(broker, queue, args.messages, args.size, args.batch)
                consume = _drain(broker, queue, args.messages, args.batch, dead_letter=False)
                _send(broker, queue, args.dead_letter, args.size, args.batch)
                move = _drain(broker, queue, args.dead_letter, args.batch, dead_letter=True)
                assert broker.audit().ok, "the ledger does not balance"
            finally:
                broker.delete_queue(queue)
            store = url.split(":", 1)[0]
            print(
                f"store={store} produce_msgs_per_s={produce:.0f} "
                f"consume_complete_msgs_per_s={consume:.0f} dlq_move_msgs_per_s={move:.0f}"
            )


if __name__ == "__main__":
    main()
