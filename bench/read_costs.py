"""What a reader pays when nothing is due: ``counts``, ``get_queue``, ``peek`` of a queue
holding ``--held`` messages (``--locked`` of them under a lock that holds), and
``list_queues`` and ``audit`` over ``--queues`` such queues.

Every read first asks the store whether anything of the entity is due on its clock (an
expired lock, a due scheduled message, an expired time to live) and applies it; this measures
what that question adds to a read that finds nothing. Each read-out is the median of
``--repeats`` calls, in microseconds. Prints one line:

    store=sqlite held=… locked=… queues=… counts_us=… get_queue_us=… peek_us=…
    list_queues_us=… audit_us=…

With ``--postgres`` a temporary PostgreSQL server is started from the machine's binaries.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from queue_throughput import store_url

import poisonq
from poisonq import Message

SEND_BATCH = 1_000


def _median_us(read: Callable[[], object], repeats: int) -> float:
    read()  # warm the statement caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--postgres", action="store_true", help="a temporary PostgreSQL server")
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--locked", type=int, default=1_000)
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    body = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
    with (
        tempfile.TemporaryDirectory() as tmp,
        store_url(args, tmp) as url,
        poisonq.connect(url) as broker,
    ):
        for number in range(args.queues):
            queue = f"orders-{number}"
            broker.create_queue(queue, lock_duration=300)
            held = args.held if number == 0 else 10
            sender = broker.sender(queue)
            for start in range(0, held, SEND_BATCH):
                sender.send([Message(body=body)] * min(SEND_BATCH, held - start))
        receiver = broker.receiver("orders-0")
        for start in range(0, args.locked, 500):
            receiver.receive(max_messages=min(500, args.locked - start))
        figures = {
            "counts_us": _median_us(lambda: broker.counts("orders-0"), args.repeats),
            "get_queue_us": _median_us(lambda: broker.get_queue("orders-0"), args.repeats),
            "peek_us": _median_us(lambda: broker.peek("orders-0", max_messages=10), args.repeats),
            "list_queues_us": _median_us(broker.list_queues, args.repeats // 10 or 1),
            "audit_us": _median_us(broker.audit, args.repeats // 10 or 1),
        }
    store = url.split(":", 1)[0]
    shown = " ".join(f"{name}={value:.0f}" for name, value in figures.items())
    print(f"store={store} held={args.held} locked={args.locked} queues={args.queues} {shown}")


if __name__ == "__main__":
    main()
