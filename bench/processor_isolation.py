"""What ``Processor(isolation="process")`` costs per message against the handler in-process.

``--messages`` messages of 512 bytes (20,000 by default) in a SQLite queue are drained by a
``Processor`` (batches of 100, one thread) whose handler parses the body as JSON and does
nothing else: the cheapest handler, on which the isolation's own cost shows most. The two
modes take turns, ``--rounds`` times each on a fresh store, and the median of each is taken.
A child process runs the handler on a receive's messages, pickled into memory it shares with
the Processor, in one round trip of a few words through a pipe, and writes their outcomes back
the same way, so the cost is per handler run; a handler that does real work (a call to another
service, a database write) hides it.

Prints one line per mode, ``isolation=none msgs_per_s=… us_per_msg=…``, then
``isolation=process msgs_per_s=… us_per_msg=… extra_us_per_msg=… ratio=…``, where ``ratio``
is the process mode's throughput over the in-process one's, measured beside it in the same
run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import poisonq
from poisonq import Message, Processor, ReceivedMessage
from poisonq.processor.handler_runs import Isolation

BODY = json.dumps({"order_id": 123456, "customer": "C01234", "note": "x" * 440}).encode()
MODES: dict[str, Isolation] = {"none": None, "process": "process"}


def handle(message: ReceivedMessage) -> None:
    json.loads(message.body)


def drain(messages: int, isolation: Isolation) -> float:
    """Seconds a Processor takes to drain ``messages`` messages (sending them not counted)."""
    with (
        tempfile.TemporaryDirectory() as work,
        poisonq.connect(f"sqlite:///{Path(work) / 'store.db'}") as broker,
    ):
        broker.create_queue("orders")
        sender = broker.sender("orders")
        for start in range(0, messages, 1000):
            sender.send([Message(body=BODY)] * min(1000, messages - start))
        processor = Processor(
            broker, "orders", handle, batch_size=100, max_wait=0, isolation=isolation
        )
        started = time.perf_counter()
        stats = processor.run(until_idle=True)
        seconds = time.perf_counter() - started
        assert stats.completed == messages, stats
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    taken: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, isolation in MODES.items():
            taken[mode].append(drain(args.messages, isolation))
    per_msg = {mode: statistics.median(s) / args.messages * 1e6 for mode, s in taken.items()}
    inline = per_msg["none"]
    print(f"isolation=none msgs_per_s={1e6 / inline:.0f} us_per_msg={inline:.1f}")
    isolated = per_msg["process"]
    print(
        f"isolation=process msgs_per_s={1e6 / isolated:.0f} us_per_msg={isolated:.1f}"
        f" extra_us_per_msg={isolated - inline:.1f} ratio={inline / isolated:.2f}"
    )


if __name__ == "__main__":
    main()
