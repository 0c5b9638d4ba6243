"""Transient store errors: a PostgreSQL server restarted under running Processors, and a
SQLite file whose write lock another process holds past the busy timeout. Operations are
retried with backoff (``retry_total``), apart from any message's delivery count; what cannot
be retried raises a typed error; nothing is lost or half-written."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import poisonq
from poisonq import Message, Processor, ReceivedMessage
from poisonq.errors import StoreConflictError
from poisonq.store.postgres.store import outage, translated
from poisonq.store.sqlite import SqliteStore
from poisonq.testing.pgserver import TemporaryServer
from tests.helpers import assert_balanced, execute_behind_the_back


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, 2])
def test_processors_ride_out_a_postgresql_restart(
    own_server: TemporaryServer, concurrency: int
) -> None:
    """Every thread rides out a restart with the client's retries: all messages completed,
    none dead-lettered, none completed twice. A receive whose answer the restart cut may
    have locked messages under a token nobody knows: they come again once that lock runs
    out, so the run is repeated (bounded) until nothing is held."""
    url = own_server.database_url("outage")
    count = 600
    lock_duration = 3
    with poisonq.connect(url) as setup:
        setup.create_queue("payments", max_delivery_count=5, lock_duration=lock_duration)
        setup.sender("payments").send([Message(body=str(n)) for n in range(count)])
    handled: Counter[str] = Counter()
    lock = threading.Lock()
    restarted = threading.Event()

    def handle(message: ReceivedMessage) -> None:
        time.sleep(0.002)
        with lock:
            handled[message.text] += 1

    def restart_midway() -> None:
        while sum(handled.values()) < count // 3:
            time.sleep(0.01)
        own_server.restart(down_for=1.0)
        restarted.set()

    with poisonq.connect(url, retry_backoff_factor=0.5) as broker:
        chaos = threading.Thread(target=restart_midway)
        chaos.start()
        processor = Processor(
            broker, "payments", handle, batch_size=10, concurrency=concurrency, max_wait=0.5
        )
        stats = processor.run(until_idle=True)
        chaos.join()
        assert restarted.is_set()
        stats.add(run_until_nothing_is_held(processor, broker, lock_duration))
        counts = broker.counts("payments")
        assert (counts["completed"], counts["dead_lettered"]) == (count, 0)
        assert set(handled) == {str(n) for n in range(count)}
        # A settlement whose commit was cut may have committed: its retry finds the locks
        # gone. Those messages count as lost locks, never twice as completed.
        assert stats.completed + stats.lock_lost >= count
        assert stats.completed <= count
        assert_balanced(broker)


@pytest.mark.slow
def test_a_client_started_while_postgresql_restarts_waits_for_it(
    own_server: TemporaryServer,
) -> None:
    url = own_server.database_url("outage")
    down = threading.Thread(target=own_server.restart, kwargs={"down_for": 1.5})
    down.start()
    time.sleep(0.5)  # the server is down now
    with poisonq.connect(url, retry_backoff_factor=0.5) as broker:  # waited it out
        broker.create_queue("orders")
        assert broker.counts("orders")["active"] == 0
    down.join()


@pytest.mark.slow
def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends(
    own_server: TemporaryServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Two Processor threads and the pool's workers meet a restart of several seconds: the
    log has one line for the store going away and one for its return, and none of
    psycopg's warnings about the broken and refused connections. Every message is completed
    once what a cut receive left locked has come back."""
    url = own_server.database_url("outage")
    count, lock_duration = 400, 10  # longer than the outage
    with poisonq.connect(url) as setup:
        setup.create_queue("payments", lock_duration=lock_duration)
        setup.sender("payments").send([Message(body=str(n)) for n in range(count)])
    handled = threading.Semaphore(0)

    def handle(message: ReceivedMessage) -> None:
        time.sleep(0.005)
        handled.release()

    def restart_midway() -> None:
        for _ in range(count // 4):
            handled.acquire()
        own_server.restart(down_for=3.0)

    with caplog.at_level(logging.WARNING), poisonq.connect(url, retry_total=6) as broker:
        chaos = threading.Thread(target=restart_midway)
        chaos.start()
        processor = Processor(broker, "payments", handle, batch_size=10, concurrency=2)
        processor.run(until_idle=True)
        chaos.join()
        run_until_nothing_is_held(processor, broker, lock_duration)
        assert broker.counts("payments")["completed"] == count
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the store is unreachable, retrying until it is back")
    assert lines[1].startswith(f"store {url} is reachable again after")


@pytest.mark.slow
def test_a_call_during_an_outage_raises_after_its_retries_and_the_first_after_it_succeeds(
    own_server: TemporaryServer,
) -> None:
    """With the default retries a call waits about 0.8 + 1.6 + 3.2 s, as documented, and then
    raises StoreUnavailableError: an attempt meets a refused connection at once instead of
    waiting for the pool. Once the server is back the next call succeeds on its first
    attempt, without waiting for the pool to reconnect. (The bounds are generous.)"""
    url = own_server.database_url("outage")
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        down = threading.Thread(target=own_server.restart, kwargs={"down_for": 15.0})
        down.start()
        time.sleep(1.0)  # the server is down now
        began = time.monotonic()
        with pytest.raises(poisonq.StoreUnavailableError):
            broker.counts("orders")
        assert 4.0 < time.monotonic() - began < 15.0
        down.join()
        began = time.monotonic()
        assert broker.counts("orders")["active"] == 0
        assert time.monotonic() - began < 5.0
        assert_balanced(broker)


def test_a_deadlocks_victim_is_a_conflict_not_an_outage(pg_url: str) -> None:
    """A transaction PostgreSQL chose as a deadlock's victim is reported as a
    ``StoreConflictError`` (retried, nothing committed), and its connection is not taken for
    a sign that the server went away."""
    with psycopg.connect(pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS deadlock_pair (id int PRIMARY KEY)")
        setup.execute("INSERT INTO deadlock_pair VALUES (1), (2) ON CONFLICT DO NOTHING")
    errors: list[psycopg.Error] = []
    both_locked = threading.Barrier(2, timeout=10)

    def lock_both(first: int, second: int) -> None:
        with psycopg.connect(pg_url) as conn:
            try:
                conn.execute("SELECT FROM deadlock_pair WHERE id = %s FOR UPDATE", (first,))
                both_locked.wait()
                conn.execute("SELECT FROM deadlock_pair WHERE id = %s FOR UPDATE", (second,))
            except psycopg.Error as exc:
                errors.append(exc)

    threads = [threading.Thread(target=lock_both, args=pair) for pair in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    (victim,) = errors
    error = translated(victim, "test")
    assert isinstance(error, StoreConflictError) and "deadlock" in str(error)
    assert not outage(victim)


def test_a_wrong_database_is_refused_at_once_not_retried(own_server: TemporaryServer) -> None:
    with pytest.raises(poisonq.StoreError, match="does not exist") as caught:
        poisonq.connect(own_server.database_url("nowhere"))
    assert not isinstance(caught.value, poisonq.StoreUnavailableError)  # (only those retry)


def run_until_nothing_is_held(
    processor: Processor, broker: poisonq.Broker, lock_duration: float
) -> poisonq.ProcessorStats:
    """Run ``processor`` again (bounded) while messages of its queue are locked: a receive
    whose answer an outage cut locked them under a token nobody knows, and they come back
    once that lock runs out."""
    stats = poisonq.ProcessorStats()
    for _ in range(3):
        if broker.counts(processor.address)["locked"] == 0:
            break
        time.sleep(lock_duration + 0.5)
        stats.add(processor.run(until_idle=True))
    return stats


class WriteLockHolder(threading.Thread):
    """Another program holding SQLite's write lock (BEGIN IMMEDIATE) for ``seconds``."""

    def __init__(self, path: Path, seconds: float) -> None:
        super().__init__()
        self.path, self.seconds, self.held = path, seconds, threading.Event()

    def run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        self.held.set()
        time.sleep(self.seconds)
        db.execute("COMMIT")
        db.close()

    def hold(self) -> WriteLockHolder:
        self.start()
        self.held.wait()
        return self


@pytest.mark.slow
def test_a_busy_sqlite_file_is_waited_out(tmp_path: Path) -> None:
    path = tmp_path / "queues.db"
    with poisonq.connect(f"sqlite:///{path}?busy_timeout=0.2", retry_backoff_factor=0.3) as broker:
        broker.create_queue("orders")
        holder = WriteLockHolder(path, 0.8).hold()
        broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
        holder.join()
        assert broker.counts("orders")["active"] == 2
        assert_balanced(broker)


def test_a_busy_sqlite_file_past_the_retries_is_a_typed_error_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queues.db"
    with poisonq.connect(f"sqlite:///{path}?busy_timeout=0.1", retry_total=0) as broker:
        broker.create_queue("orders")
        holder = WriteLockHolder(path, 0.5).hold()
        with pytest.raises(poisonq.StoreUnavailableError, match="locked"):
            broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
        holder.join()
        assert broker.counts("orders")["active"] == 0  # all or nothing
        broker.sender("orders").send(Message(body=b"c"))  # and work goes on
        assert broker.counts("orders")["active"] == 1
        assert_balanced(broker)


def test_retry_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(poisonq.InvalidOptionError, match="retry_total"):
        poisonq.connect(f"sqlite:///{tmp_path / 'q.db'}", retry_total=-1)
    with pytest.raises(poisonq.InvalidOptionError, match="busy_timeout"):
        poisonq.connect(f"sqlite:///{tmp_path / 'q.db'}?busy_timeout=soon")


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_store_that_stays_unavailable_stops_every_thread_and_raises(
    tmp_path: Path, concurrency: int
) -> None:
    """No thread dies alone: before, a thread's StoreError was printed by threading and
    run() returned normally, with the other threads' stats only."""
    path = tmp_path / "q.db"
    with poisonq.connect(f"sqlite:///{path}?busy_timeout=0.05", retry_total=0) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=str(n)) for n in range(200)])
        holder = WriteLockHolder(path, 2.0)
        once = threading.Lock()

        def handle(message: ReceivedMessage) -> None:
            with once:
                if not holder.held.is_set():
                    holder.hold()

        processor = Processor(broker, "orders", handle, concurrency=concurrency, max_wait=0)
        with pytest.raises(poisonq.StoreUnavailableError):
            processor.run(until_idle=True)
        holder.join()
        assert_balanced(broker)


def _page_limit(broker: poisonq.Broker, pages: int) -> None:
    """Cap the SQLite file at ``pages`` pages, as a full disk would (``max_page_count`` holds
    for the connection that sets it, so it is set on the store's own)."""
    store = broker.store
    assert isinstance(store, SqliteStore)
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_sqlite_file_is_a_typed_error_that_writes_nothing(tmp_path: Path) -> None:
    with poisonq.connect(f"sqlite:///{tmp_path / 'queues.db'}") as broker:
        broker.create_queue("orders")
        receiver = broker.receiver("orders")
        broker.sender("orders").send([Message(body=b"x" * 1000) for _ in range(20)])
        held = receiver.receive(max_messages=5)
        (used,) = execute_behind_the_back(
            f"sqlite:///{tmp_path / 'queues.db'}", "PRAGMA page_count"
        )[0]
        _page_limit(broker, int(used))
        with pytest.raises(poisonq.StoreFullError, match="full"):
            broker.sender("orders").send([Message(body=b"y" * 4000) for _ in range(50)])
        with pytest.raises(poisonq.StoreFullError):
            receiver.dead_letter(held[0], reason="Bad", error=ValueError("x" * 20000))
        assert broker.counts("orders")["active"] == 15  # nothing of the failed send
        assert broker.counts("orders")["locked"] == 5
        assert_balanced(broker)
        receiver.complete(held[1])  # what frees space still works

        _page_limit(broker, 1_000_000)  # the disk has room again: work goes on
        broker.sender("orders").send([Message(body=b"y" * 4000) for _ in range(50)])
        receiver.dead_letter(held[0], reason="Bad", error=ValueError("x" * 20000))
        assert broker.counts("orders")["active"] == 65
        assert_balanced(broker)
