"""Queue throughput: produce, consume+complete, and dead-letter moves, durably.

Sends ``--messages`` messages of ``--size`` bytes in batches of ``--batch``, receives and
completes them in batches, then sends ``--dead-letter`` more and dead-letters them as they are
received. Prints one machine-readable line:

    store=sqlite produce_msgs_per_s=... consume_complete_msgs_per_s=... dlq_move_msgs_per_s=...

Beside it runs a peer with the same batches, each phase right beside poisonq's (so both
meet the same load on a shared machine), and a second line gives the peer's rates and
poisonq's ratio to them. On SQLite the peer is a minimal hand-written SQLite queue with the
same durability (``bench/sqlite_pattern.py``), in a file next to the store's; with a
PostgreSQL store (``--url postgresql://...``, or ``--postgres`` for a temporary server
started from the machine's binaries, durable as installed) it is the plain pgmq SQL pattern
(``bench/pgmq_pattern.py``) on the same server:

    minimal_sqlite_produce_msgs_per_s=... ratio_produce=... ratio_consume_complete=... ...
    pgmq_produce_msgs_per_s=... ratio_produce=... ratio_consume_complete=... ratio_dlq_move=...

The machine's speed drifts by ±20 % from one second to the next on a shared host, so the
phases run ``--rounds`` times (who goes first alternates) and each number printed is the
median over the rounds; a ratio is the median of the rounds' ratios. Every round starts from
clean tables (pgmq's are new, poisonq's vacuumed). ``queue_floors.py`` measures how far
poisonq's schema could go with bare SQL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import pgmq_pattern
import sqlite_pattern

import poisonq
from poisonq import DeadLetter, Message

Peer = pgmq_pattern.PgmqQueue | sqlite_pattern.MinimalSqliteQueue


def _send(broker: poisonq.Broker, queue: str, count: int, body: bytes, batch: int) -> float:
    sender = broker.sender(queue)
    started = time.perf_counter()
    for start in range(0, count, batch):
        sender.send([Message(body=body) for _ in range(min(batch, count - start))])
    return count / (time.perf_counter() - started)


def _drain(broker: poisonq.Broker, queue: str, count: int, batch: int, dead_letter: bool) -> float:
    """Receive ``count`` messages in batches and complete (or dead-letter) them. Settling
    one batch shares a transaction with receiving the next, as a consumer loop would."""
    receiver = broker.receiver(queue)
    done = 0
    started = time.perf_counter()
    messages = receiver.receive(max_messages=batch)
    while messages:
        done += len(messages)
        if dead_letter:
            moves = [
                DeadLetter(m.sequence_number, m.lock_token or "", "Bench", "moved by the benchmark")
                for m in messages
            ]
            messages = receiver.settle_and_receive(moves, max_messages=batch)
        else:
            messages = receiver.complete_and_receive(messages, max_messages=batch)
    if done != count:
        raise SystemExit(f"expected {count} messages, received {done}")
    return count / (time.perf_counter() - started)


def _round(
    broker: poisonq.Broker,
    peer: Peer,
    args: argparse.Namespace,
    ours_first: bool,
) -> tuple[pgmq_pattern.Rates, pgmq_pattern.Rates]:
    """Run each phase on poisonq and at once on the peer (the order as told), so that both
    meet the same load. Returns the rates of each."""
    body = os.urandom(args.size // 2 + 1).hex()[: args.size]
    queue = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    broker.create_queue(queue)
    ours: pgmq_pattern.Rates = {}
    theirs: pgmq_pattern.Rates = {}
    plain = peer.fresh()

    def both(phase: str, mine: Callable[[], float], other: Callable[[Peer], float]) -> None:
        pgmq_pattern.beside((ours, theirs), ours_first, phase, mine, lambda: other(plain))

    try:
        both(
            "produce",
            lambda: _send(broker, queue, args.messages, body.encode(), args.batch),
            lambda q: q.send(args.messages, body, args.batch),
        )
        both(
            "consume_complete",
            lambda: _drain(broker, queue, args.messages, args.batch, False),
            lambda q: q.drain(args.messages, args.batch, archive=False),
        )
        _send(broker, queue, args.dead_letter, body.encode(), args.batch)
        plain.send(args.dead_letter, body, args.batch)
        both(
            "dlq_move",
            lambda: _drain(broker, queue, args.dead_letter, args.batch, True),
            lambda q: q.drain(args.dead_letter, args.batch, archive=True),
        )
        assert broker.audit().ok, "the ledger does not balance"
    finally:
        broker.delete_queue(queue)
    return ours, theirs


@contextlib.contextmanager
def store_url(args: argparse.Namespace, tmp: str) -> Iterator[str]:
    """``--url``, else a temporary PostgreSQL server's database with ``--postgres``, else a
    fresh SQLite file in ``tmp``."""
    if not args.postgres:
        yield args.url or f"sqlite:///{tmp}/bench.db"
        return
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        yield server.create_database("bench")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="store URL (default: a fresh SQLite file, synchronous=FULL)")
    parser.add_argument(
        "--postgres", action="store_true", help="start a temporary PostgreSQL server and use it"
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--dead-letter", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of every phase; medians are printed"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, store_url(args, tmp) as url:
        store = url.split(":", 1)[0]
        postgres = store in ("postgresql", "postgres")
        peer: Peer
        if postgres:
            peer, prefix = pgmq_pattern.PgmqQueue(url), "pgmq_"
        else:
            peer = sqlite_pattern.MinimalSqliteQueue(os.path.join(tmp, "minimal.db"))
            prefix = "minimal_sqlite_"
        rounds = []
        try:
            with poisonq.connect(url) as broker:
                for number in range(args.rounds):
                    rounds.append(_round(broker, peer, args, ours_first=number % 2 == 0))
        finally:
            peer.close()
        rates, plain, ratios = pgmq_pattern.medians(rounds)
        print(f"store={store} {pgmq_pattern.rate_fields('', rates)}")
        print(f"{pgmq_pattern.rate_fields(prefix, plain)} {pgmq_pattern.ratio_fields(ratios)}")


if __name__ == "__main__":
    main()
