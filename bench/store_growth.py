"""Does the work slow as the store grows? The same phases on a store that holds ``--held``
messages and on an empty one, beside each other in one run.

The big store holds ``--held`` messages (10,000,000 by default) sent through the API into a
backlog queue nobody reads, and ``--dead-letters`` (1,000,000) dead-lettered from another:
what a store that has been running a while carries. Each round then runs, on a fresh queue of
each store, right after each other (who goes first alternates, so both meet the same load on
a shared machine):

- ``produce``, ``consume_complete``, ``dlq_move``: the phases of ``queue_throughput.py``;
- ``lease_cycle``: what a pipeline batch asks of the store: a lease of ``--lease`` messages
  taken, its rows read as the executors read them, and completed.

On PostgreSQL the big database is vacuumed and analyzed after its build (counted in
``build_s``). Prints one line, ``held=… build_s=…`` with each phase's median rate on the big store
(``{phase}_msgs_per_s``), on the empty one (``empty_{phase}_msgs_per_s``), and the median of
the rounds' ratios (``ratio_{phase}``, big over empty: 1.0 means holding costs nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import queue_throughput

import poisonq
from poisonq import DeadLetter, Message

BODY = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
FILL_BATCH = 10_000
PHASES = ("produce", "consume_complete", "dlq_move", "lease_cycle")
Rates = dict[str, float]


def fill(broker: poisonq.Broker, held: int, dead_letters: int) -> None:
    """Hold ``held`` active messages in ``backlog`` and ``dead_letters`` in ``old``'s
    dead-letter queue, in batches (with a count printed now and then: this takes minutes)."""
    broker.create_queue("backlog")
    broker.create_queue("old")
    for queue, count in (("backlog", held), ("old", dead_letters)):
        sender = broker.sender(queue)
        for start in range(0, count, FILL_BATCH):
            sender.send([Message(body=BODY)] * min(FILL_BATCH, count - start))
            if start and start % 1_000_000 == 0:
                print(f"# {queue}: {start:,} sent", flush=True)
    receiver = broker.receiver("old")
    messages = receiver.receive(max_messages=FILL_BATCH)
    while messages:
        moves = [DeadLetter(m.sequence_number, m.lock_token or "", "Old", "") for m in messages]
        messages = receiver.settle_and_receive(moves, max_messages=FILL_BATCH)


def settle(url: str) -> None:
    """Vacuum and analyze a PostgreSQL store after its build, as a store that has been running a
    while has been: otherwise the rounds meet the autovacuum's first pass over the new rows."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def lease_cycle(broker: poisonq.Broker, queue: str, count: int) -> float:
    """Send ``count`` messages (not timed), then take them as one lease, read its rows and
    complete it: messages/s."""
    sender = broker.sender(queue)
    for start in range(0, count, FILL_BATCH):
        sender.send([Message(body=BODY)] * min(FILL_BATCH, count - start))
    started = time.perf_counter()
    lease = broker.acquire_lease(queue, "bench", 1, count)
    if lease is None or lease.count != count or len(broker.lease_rows(lease)) != count:
        raise SystemExit(f"the lease did not hold {count} messages")
    if broker.complete_lease(lease) != count:
        raise SystemExit("the lease did not complete")
    return count / (time.perf_counter() - started)


def one_round(
    brokers: tuple[poisonq.Broker, poisonq.Broker], args: argparse.Namespace, big_first: bool
) -> tuple[Rates, Rates]:
    """Every phase on a fresh queue of each store, right after each other."""
    queue = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    order = brokers if big_first else brokers[::-1]
    for broker in brokers:
        broker.create_queue(queue, lock_duration=300)
    phases: dict[str, Callable[[poisonq.Broker], float]] = {
        "produce": lambda b: queue_throughput._send(b, queue, args.messages, BODY, args.batch),
        "consume_complete": lambda b: queue_throughput._drain(
            b, queue, args.messages, args.batch, False
        ),
        "dlq_move": lambda b: queue_throughput._drain(b, queue, args.dead_letter, args.batch, True),
        "lease_cycle": lambda b: lease_cycle(b, queue, args.lease),
    }
    rates: dict[int, Rates] = {id(b): {} for b in brokers}
    try:
        for phase, run in phases.items():
            if phase == "dlq_move":
                for broker in brokers:
                    queue_throughput._send(broker, queue, args.dead_letter, BODY, args.batch)
            for broker in order:
                rates[id(broker)][phase] = run(broker)
        for broker in brokers:
            if not broker.audit().ok:
                raise SystemExit("the ledger does not balance")
    finally:
        for broker in brokers:
            broker.delete_queue(queue)
    return rates[id(brokers[0])], rates[id(brokers[1])]


@contextlib.contextmanager
def two_stores(args: argparse.Namespace, tmp: str) -> Iterator[tuple[str, str]]:
    """Two SQLite files, or two databases of one temporary PostgreSQL server."""
    if not args.postgres:
        yield f"sqlite:///{tmp}/big.db", f"sqlite:///{tmp}/empty.db"
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        yield server.create_database("big"), server.create_database("empty")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres", action="store_true", help="two databases of a temporary PostgreSQL server"
    )
    parser.add_argument("--held", type=int, default=10_000_000, help="active messages held")
    parser.add_argument("--dead-letters", type=int, default=1_000_000, help="dead letters held")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--lease", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as tmp,
        two_stores(args, tmp) as (big_url, empty_url),
        poisonq.connect(big_url) as big,
        poisonq.connect(empty_url) as empty,
    ):
        started = time.perf_counter()
        fill(big, args.held, args.dead_letters)
        if args.postgres:
            settle(big_url)
        build = time.perf_counter() - started
        rounds = [one_round((big, empty), args, n % 2 == 0) for n in range(args.rounds)]
    store = "postgres" if args.postgres else "sqlite"
    fields = [f"store={store} held={args.held + args.dead_letters} build_s={build:.0f}"]
    for phase in PHASES:
        fields.append(f"{phase}_msgs_per_s={statistics.median(r[0][phase] for r in rounds):.0f}")
        fields.append(
            f"empty_{phase}_msgs_per_s={statistics.median(r[1][phase] for r in rounds):.0f}"
        )
    fields += [
        f"ratio_{p}={statistics.median(r[0][p] / r[1][p] for r in rounds):.2f}" for p in PHASES
    ]
    print(" ".join(fields))


if __name__ == "__main__":
    main()
