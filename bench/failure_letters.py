"""Settling failed messages that each carry their own failure, as every poison path does (a
pipeline's ``PermanentError`` rows, its expectations gate, a Processor's handler errors): each
dead-letter has its own description and :class:`~poisonq.FailureRecord`, each abandon its
own failure.

- ``lease_dead_letter``: ``--messages`` messages taken as one lease
  (:meth:`Broker.acquire_lease`) and all dead-lettered in one :meth:`Broker.settle_held`,
  each with its own description and failure (a traceback of its own, one of 10 fingerprints).
- ``lease_abandon``: the same with :class:`~poisonq.Abandon` and a failure each, on a queue
  whose retry policy redelivers them (no poisoning).
- ``lease_poison``: the same abandons on a queue with ``max_delivery_count=1``: each used its
  last delivery and is poisoned (moved to the dead-letter queue).
- ``receiver_dead_letter``: the per-message path: batches of ``--batch`` received and
  dead-lettered with :meth:`Receiver.settle_and_receive`, a description and failure each.

Each is the median of ``--repeats`` runs on a fresh queue, in microseconds a message; the
audit must balance after each. Prints one line for scripts::

    store=sqlite lease_dead_letter_us=... lease_abandon_us=... lease_poison_us=...
    receiver_dead_letter_us=...

SQLite is a fresh file (WAL, ``synchronous=FULL``), PostgreSQL a temporary server with
``--postgres`` or ``--url postgresql://...``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from queue_throughput import store_url

import poisonq
from poisonq import Abandon, DeadLetter, FailureRecord, Message, Settlement

BODY = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
SEND_BATCH = 10_000


def failure(seq: int) -> FailureRecord:
    """A failure of its own: the message and traceback name the message, 10 fingerprints."""
    return FailureRecord(
        time=1_700_000_000.0,
        error_type="ValueError",
        message=f"order {seq}: amount is negative",
        traceback=f'Traceback (most recent call last):\n  File "job.py", line {seq % 97}\n'
        f"ValueError: order {seq}: amount is negative\n",
        fingerprint=f"fp{seq % 10}",
    )


def letter(seq: int, token: str) -> Settlement:
    return DeadLetter(seq, token, "PermanentError", f"order {seq} is invalid", failure(seq))


def abandon(seq: int, token: str) -> Settlement:
    return Abandon(seq, token, failure(seq))


def fill(broker: poisonq.Broker, queue: str, count: int, **options: object) -> None:
    broker.create_queue(queue, lock_duration=300, **options)  # type: ignore[arg-type]
    sender = broker.sender(queue)
    for start in range(0, count, SEND_BATCH):
        sender.send([Message(body=BODY)] * min(SEND_BATCH, count - start))


def lease_settle(
    broker: poisonq.Broker,
    queue: str,
    count: int,
    settle: Callable[[int, str], Settlement],
    **options: object,
) -> float:
    """Seconds one settle_held of a lease's ``count`` messages takes."""
    fill(broker, queue, count, **options)
    lease = broker.acquire_lease(queue, "bench", 1, count)
    assert lease is not None and lease.count == count
    seqs = [row[0] for row in broker.lease_rows(lease)]  # LEASE_COLUMNS: sequence_number first
    settlements = [settle(seq, lease.lock_token) for seq in seqs]
    started = time.perf_counter()
    _, lost = broker.settle_held(queue, settlements)
    elapsed = time.perf_counter() - started
    assert not lost
    assert broker.audit().ok, "the ledger does not balance"
    broker.delete_queue(queue)
    return elapsed


def receiver_dead_letter(broker: poisonq.Broker, queue: str, count: int, batch: int) -> float:
    """Seconds the settle_and_receive calls that dead-letter ``count`` messages take."""
    fill(broker, queue, count)
    receiver = broker.receiver(queue)
    messages = receiver.receive(max_messages=batch)
    elapsed = 0.0
    while messages:
        letters = [letter(m.sequence_number, m.lock_token or "") for m in messages]
        started = time.perf_counter()
        messages = receiver.settle_and_receive(letters, max_messages=batch)
        elapsed += time.perf_counter() - started
    assert broker.audit().ok, "the ledger does not balance"
    broker.delete_queue(queue)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--postgres", action="store_true", help="a temporary PostgreSQL server")
    args = parser.parse_args()
    n = args.messages
    phases: dict[str, Callable[[poisonq.Broker, str], float]] = {
        "lease_dead_letter": lambda b, q: lease_settle(b, q, n, letter),
        "lease_abandon": lambda b, q: lease_settle(b, q, n, abandon, max_delivery_count=10),
        "lease_poison": lambda b, q: lease_settle(b, q, n, abandon, max_delivery_count=1),
        "receiver_dead_letter": lambda b, q: receiver_dead_letter(b, q, n, args.batch),
    }
    with tempfile.TemporaryDirectory() as tmp, store_url(args, tmp) as url:
        store = "postgresql" if url.startswith("postgres") else "sqlite"
        with poisonq.connect(url) as broker:
            times: dict[str, list[float]] = {name: [] for name in phases}
            for repeat in range(args.repeats):  # the phases take turns
                for name, run in phases.items():
                    times[name].append(run(broker, f"{name}-{repeat}"))
    medians = {name: statistics.median(t) / n * 1e6 for name, t in times.items()}
    fields = " ".join(f"{name}_us={us:.1f}" for name, us in medians.items())
    print(f"store={store} messages={n} {fields}")


if __name__ == "__main__":
    main()
