"""What an operator's reads of a big dead-letter queue cost: the reads in proportion to groups.

Builds a queue whose dead-letter queue holds ``--held`` dead letters (1,000,000 by default;
written with bulk SQL, the ledger to match; the aggregates kept by PostgreSQL's triggers as the
rows go in, and on SQLite recounted by the store as it opens the file and finds them short, with
a warning): 5 reasons, 20 fingerprints (each with its error type), 10 subjects, spread
over the last day. Then, server side (the app in this process, one client), the median of
``--repeats`` of each:

- ``metrics_ms``: a ``/metrics`` scrape;
- ``metrics_loaded_ms``: the slowest scrape while ``--loaders`` threads load explorer pages
  without a pause;
- ``by_reason_ms``, ``by_fingerprint_ms``, ``by_subject_ms``: the explorer's page grouped so
  (groups, causes, chart, the first page of every dead letter);
- ``group_page_ms``: the explorer on one reason (that group's first page), and
  ``fingerprint_page_ms`` on one fingerprint;
- ``dlq_list_ms``: ``poisonq dlq list`` as a command, start-up included.

Prints one line per store::

    store=sqlite held=1000000 build_s=… metrics_ms=… metrics_loaded_ms=… by_reason_ms=…
    by_fingerprint_ms=… by_subject_ms=… group_page_ms=… fingerprint_page_ms=… dlq_list_ms=…

``--held`` takes several sizes (``--held 1000000 10000000``); ``--postgres`` runs the same on
a temporary PostgreSQL server (started from the machine's binaries) after SQLite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient

import poisonq
from poisonq import Message
from poisonq.server.app import create_app

BODY = b'{"order_id": 123456, "customer": "C01234", "amount": 12.3}'
TOKEN = "bench-token"
QUEUE = "orders"
REASONS, FINGERPRINTS, SUBJECTS = 5, 20, 10
DAY = 86_400.0

# ?1 count, ?2 the dead-letter queue's id, ?3 the body, ?4 the body's size, ?5 now.
_SQLITE_MESSAGES = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)"
    " INSERT INTO messages (entity_id, state, message_id, body, size, subject, enqueued_at,"
    " dead_letter_reason, dead_letter_description, dead_letter_source, dead_lettered_at,"
    " last_error_type, last_fingerprint, delivery_count)"
    " SELECT ?2, 'dead_lettered', 'bulk-' || i, ?3, ?4, 'subject-' || (i % 10), ?5 - 86400,"
    " 'Reason' || (i % 5), 'checked by the bench', 'orders', ?5 - 86400 + i * 86400.0 / ?1,"
    " 'Error' || (i % 20), printf('%016x', 1000003 * (i % 20)), 1 FROM n"
)
_POSTGRES_MESSAGES = (
    "INSERT INTO messages (entity_id, state, message_id, body, size, subject, enqueued_at,"
    " dead_letter_reason, dead_letter_description, dead_letter_source, dead_lettered_at,"
    " last_error_type, last_fingerprint, delivery_count)"
    " SELECT %(entity)s, 'dead_lettered', 'bulk-' || i, %(body)s, %(size)s,"
    " 'subject-' || (i %% 10), %(now)s - 86400, 'Reason' || (i %% 5), 'checked by the bench',"
    " 'orders', %(now)s - 86400 + i * 86400.0 / %(count)s, 'Error' || (i %% 20),"
    " lpad(to_hex(1000003 * (i %% 20)), 16, '0'), 1 FROM generate_series(1, %(count)s) i"
)
_LEDGER = (
    "UPDATE entities SET sent = sent + {n}, moved_out = moved_out + {n},"
    " dead_lettered = dead_lettered + {n} WHERE id = {queue};"
    " UPDATE entities SET moved_in = moved_in + {n}, size_bytes = size_bytes + {size}"
    " WHERE id = {dlq}"
)


_IDS = "SELECT id FROM entities WHERE name IN ('orders', 'orders/$deadletterqueue') ORDER BY name"


def seed(url: str) -> None:
    """The queue, and one message dead-lettered the ordinary way."""
    with poisonq.connect(url) as broker:
        broker.create_queue(QUEUE)
        broker.sender(QUEUE).send(Message(body=BODY, subject="seed"))
        receiver = broker.receiver(QUEUE)
        (message,) = receiver.receive(max_messages=1)
        receiver.dead_letter(message, "Seed")


def ledger(count: int, queue: int, dlq: int) -> list[str]:
    """The ledger's updates for ``count`` messages sent to the queue and dead-lettered."""
    return _LEDGER.format(n=count, size=count * len(BODY), queue=queue, dlq=dlq).split(";")


def build_sqlite(url: str, path: Path, count: int) -> None:
    import sqlite3

    seed(url)
    db = sqlite3.connect(path, isolation_level=None)
    (queue,), (dlq,) = db.execute(_IDS).fetchall()
    db.execute("BEGIN IMMEDIATE")
    db.execute(_SQLITE_MESSAGES, (count, dlq, BODY, len(BODY), time.time()))
    for statement in ledger(count, queue, dlq):
        db.execute(statement)
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as a store in use is, not a WAL of gigabytes
    db.close()


def build_postgres(url: str, count: int) -> None:
    import psycopg

    seed(url)
    with psycopg.connect(url) as conn:
        (queue,), (dlq,) = conn.execute(_IDS).fetchall()
        params = {"entity": dlq, "body": BODY, "size": len(BODY), "now": time.time()}
        conn.execute(_POSTGRES_MESSAGES, {**params, "count": count})
        for statement in ledger(count, queue, dlq):
            conn.execute(statement)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1e3


def median_ms(work: Callable[[], object], repeats: int) -> float:
    work()  # warm the caches
    return statistics.median(timed(work) for _ in range(repeats))


def loaded_scrapes(client: TestClient, pages: list[str], loaders: int, repeats: int) -> float:
    """The slowest of ``repeats`` scrapes while ``loaders`` threads load ``pages``."""
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for page in pages:
                client.get(page).raise_for_status()

    threads = [threading.Thread(target=load) for _ in range(loaders)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        return max(timed(lambda: client.get("/metrics").raise_for_status()) for _ in range(repeats))
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def measure(url: str, held: int, repeats: int, loaders: int) -> dict[str, float]:
    explorer = f"/ui/deadletters?queue={QUEUE}"
    pages = {
        "by_reason": f"{explorer}&by=reason",
        "by_fingerprint": f"{explorer}&by=fingerprint",
        "by_subject": f"{explorer}&by=subject",
        "group_page": f"{explorer}&by=reason&reason=Reason3",
        "fingerprint_page": f"{explorer}&by=fingerprint&fingerprint={1000003 * 7:016x}",
    }
    with poisonq.connect(url) as broker:
        report = broker.audit()
        assert report.ok, report
        groups = broker.dead_letter_groups(QUEUE, "reason")
        assert sum(g.count for g in groups) == held + 1, groups
        client = TestClient(create_app(broker, token=TOKEN, open_reads=True))
        costs = {"metrics": median_ms(lambda: client.get("/metrics").raise_for_status(), repeats)}
        costs["metrics_loaded"] = loaded_scrapes(client, list(pages.values()), loaders, repeats)
        for name, page in pages.items():
            costs[name] = median_ms(lambda page=page: client.get(page).raise_for_status(), repeats)
    command = [str(Path(sys.executable).parent / "poisonq"), "--url", url, "dlq", "list", QUEUE]
    env = {**os.environ, "POISONQ_URL": url}
    costs["dlq_list"] = median_ms(
        lambda: subprocess.run(command, check=True, capture_output=True, env=env), repeats
    )
    return costs


@contextmanager
def postgres_url() -> Iterator[str]:
    from poisonq.testing.pgserver import TemporaryServer

    with TemporaryServer() as server:
        yield server.create_database("bench")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--held", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--postgres", action="store_true", help="and on a temporary PostgreSQL")
    parser.add_argument("--only-postgres", action="store_true", help="PostgreSQL alone")
    parser.add_argument("--repeats", type=int, default=5, help="of each read-out (median)")
    parser.add_argument("--loaders", type=int, default=2, help="threads loading the explorer")
    args = parser.parse_args()
    for held in args.held:
        if not args.only_postgres:
            with tempfile.TemporaryDirectory() as work:
                path = Path(work) / "dead.db"
                url = f"sqlite:///{path}"
                started = time.perf_counter()
                build_sqlite(url, path, held)
                build = time.perf_counter() - started
                report("sqlite", held, build, measure(url, held, args.repeats, args.loaders))
        if args.postgres or args.only_postgres:
            with postgres_url() as url:
                started = time.perf_counter()
                build_postgres(url, held)
                build = time.perf_counter() - started
                report("postgres", held, build, measure(url, held, args.repeats, args.loaders))


def report(store: str, held: int, build: float, costs: dict[str, float]) -> None:
    figures = "".join(f" {name}_ms={ms:.1f}" for name, ms in costs.items())
    print(f"store={store} held={held} build_s={build:.1f}{figures}", flush=True)


if __name__ == "__main__":
    main()
