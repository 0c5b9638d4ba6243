"""The PostgreSQL store on an event loop (``AsyncPostgresStore``): the engine's operations,
awaited on one loop, keep the blocking store's rules (the same transaction code runs on
psycopg's asyncio connections), hundreds of coroutines share a small pool without ever
receiving one message twice, and a failure is the blocking store's typed error."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from poisonq import (
    DeadLetterReason,
    InvalidOptionError,
    ManualClock,
    Message,
    StoreUnavailableError,
)
from poisonq.engine import Engine
from poisonq.engine.driving import drive
from poisonq.options import QueueOptions
from poisonq.store.base import MessageFilter
from poisonq.store.postgres import AsyncPostgresStore, PostgresStore
from poisonq.testing.pgserver import TemporaryServer

pytestmark = pytest.mark.postgres

Body = Callable[[Engine], Awaitable[None]]


def run(url: str, body: Body, *, max_size: int = 4, queues: int = 1) -> None:
    """Run ``body`` with an engine on an asyncio store at ``url`` (with ``orders``: 3
    deliveries, a 30 s lock), on a fresh event loop; then the audit must balance."""

    async def main() -> None:
        async with await AsyncPostgresStore.open(url, max_size=max_size) as store:
            engine = Engine(store, ManualClock())
            options = QueueOptions.build(None, max_delivery_count=3, lock_duration=30)
            await engine.create_queue("orders", options)
            await body(engine)
            await assert_balanced(engine)

    asyncio.run(main())


async def assert_balanced(engine: Engine) -> None:
    """sent = completed + dropped + held (dead letters are held in their subqueue)."""
    report = await engine.audit()
    assert report.ok, report.entries
    assert report.sent == report.completed + report.dropped + report.held


def test_send_receive_complete_runs_the_state_machine_on_the_event_loop(pg_url: str) -> None:
    async def body(engine: Engine) -> None:
        seqs = await engine.send("orders", [Message(body=b"a"), Message(body=b"b")])
        got = await engine.receive("orders", 5)
        assert [m.sequence_number for m in got] == seqs
        assert (await engine.counts("orders"))["locked"] == 2
        await engine.complete("orders", [(m.sequence_number, m.lock_token) for m in got])
        assert await engine.receive("orders", 5) == []
        report = await engine.audit()
        assert (report.sent, report.completed, report.held) == (2, 2, 0)

    run(pg_url, body)


def test_abandons_past_max_delivery_count_dead_letter_the_message(pg_url: str) -> None:
    """The poison rule, on the asyncio store: the third abandon of a queue of 3 deliveries
    moves the message to the dead-letter queue, reason MaxDeliveryCountExceeded."""

    async def body(engine: Engine) -> None:
        (seq,) = await engine.send("orders", [Message(body=b"x")])
        poisoned: list[int] = []
        for _ in range(3):
            (got,) = await engine.receive("orders", 1)
            poisoned = await engine.abandon("orders", [(seq, got.lock_token)], None)
        assert poisoned == [seq]
        (letter,) = await engine.peek("orders/$deadletterqueue", 0, 5, MessageFilter())
        assert letter.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
        assert letter.delivery_count == 3

    run(pg_url, body)


def test_a_lease_takes_its_batch_and_completes_it(pg_url: str) -> None:
    async def body(engine: Engine) -> None:
        seqs = await engine.send("orders", [Message(body=b"%d" % n) for n in range(5)])
        lease = await engine.acquire_lease("orders", "pipeline", 1, 10)
        assert lease is not None and lease.count == 5
        assert await engine.receive("orders", 5) == []  # the cover holds them
        assert await engine.complete_lease(lease) == len(seqs)
        assert (await engine.counts("orders"))["active"] == 0

    run(pg_url, body)


def test_a_session_receive_takes_the_sessions_messages_in_order(pg_url: str) -> None:
    async def body(engine: Engine) -> None:
        options = QueueOptions.build(None, requires_session=True)
        await engine.create_queue("orders-by-customer", options)
        await engine.send(
            "orders-by-customer",
            [Message(body=b"%d" % n, session_id="c1" if n % 2 else "c2") for n in range(6)],
        )
        accepted = await engine.accept_session("orders-by-customer", "c1")
        assert accepted is not None
        session, token, _ = accepted
        got = await engine.receive_session("orders-by-customer", session, token, 10)
        assert [m.body for m in got] == [b"1", b"3", b"5"]
        await engine.complete("orders-by-customer", [(m.sequence_number, token) for m in got])

    run(pg_url, body)


@pytest.mark.slow
def test_500_coroutines_on_a_pool_of_20_never_receive_a_message_twice(pg_url: str) -> None:
    """500 receivers on one loop share 20 connections: every message is received by one of
    them only, and completed once."""
    count = 1000
    received: Counter[int] = Counter()

    async def body(engine: Engine) -> None:
        sent = await engine.send("orders", [Message(body=b"%d" % n) for n in range(count)])

        async def receiver() -> None:
            for _ in range(count):  # bounded: one receive per message at most, then empty
                got = await engine.receive("orders", 1)
                if not got:
                    if sum(received.values()) >= count:
                        return
                    await asyncio.sleep(0.01)  # the rest are locked by others right now
                    continue
                received.update(m.sequence_number for m in got)
                await engine.complete("orders", [(m.sequence_number, m.lock_token) for m in got])

        await asyncio.wait_for(asyncio.gather(*(receiver() for _ in range(500))), 300)
        assert sorted(received) == sent
        assert set(received.values()) == {1}
        report = await engine.audit()
        assert (report.completed, report.held) == (count, 0)

    run(pg_url, body, max_size=20)


def test_cancelled_transactions_leave_the_pool_usable_and_nothing_lost(pg_url: str) -> None:
    """Receives cancelled at any point (waiting for a connection, mid-statement, after the
    commit: 0 to 7.5 ms after they start) roll back or commit whole, and the pool of 2
    connections replaces those cut mid-exchange: once the locks of the receives that did
    commit run out, every message is received and completed once."""
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncPostgresStore.open(pg_url, max_size=2) as store:
            engine = Engine(store, clock)
            await engine.create_queue("orders", QueueOptions.build(None, lock_duration=30))
            sent = await engine.send("orders", [Message(body=b"%d" % n) for n in range(20)])
            for turns in range(48):
                task = asyncio.create_task(engine.receive("orders", 1))
                await asyncio.sleep(0.0005 * (turns % 16))
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            clock.advance(31)  # the locks of the receives that committed run out
            done: list[int] = []
            while got := await engine.receive("orders", 5):
                await engine.complete("orders", [(m.sequence_number, m.lock_token) for m in got])
                done += [m.sequence_number for m in got]
            assert sorted(done) == sent
            await assert_balanced(engine)

    asyncio.run(main())


def test_a_value_postgresql_cannot_store_is_an_invalid_option_error(pg_url: str) -> None:
    """The asyncio store reports what the driver refuses to encode (a lone surrogate) as the
    blocking one does, and rolls the transaction back."""

    async def body(engine: Engine) -> None:
        with pytest.raises(InvalidOptionError, match="valid Unicode") as raised:
            await engine.send("orders", [Message(body=b"x", subject="half \udc00 a pair")])
        assert isinstance(raised.value.__cause__, UnicodeEncodeError)
        assert (await engine.counts("orders"))["active"] == 0  # nothing of it was written

    run(pg_url, body)


@pytest.mark.slow
def test_a_stopped_server_is_a_store_unavailable_error_until_it_is_back(
    own_server: TemporaryServer,
) -> None:
    url = own_server.database_url("outage")

    async def main() -> None:
        async with await AsyncPostgresStore.open(url) as store:
            engine = Engine(store, ManualClock())
            await engine.create_queue("orders", QueueOptions())
            restart = threading.Thread(target=own_server.restart, kwargs={"down_for": 2.0})
            restart.start()
            await asyncio.sleep(0.5)  # the server is down now
            with pytest.raises(StoreUnavailableError):
                await engine.send("orders", [Message(body=b"x")])
            await asyncio.to_thread(restart.join)
            for _ in range(50):  # bounded: the pool reconnects in the background
                try:
                    await engine.send("orders", [Message(body=b"y")])
                    break
                except StoreUnavailableError:
                    await asyncio.sleep(0.2)
            assert (await engine.counts("orders"))["active"] == 1

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("pooled", [True, False], ids=["pool-broken", "pool-never-connected"])
def test_after_an_outage_an_attempt_fails_at_once_and_the_first_after_it_succeeds(
    own_server: TemporaryServer, pooled: bool
) -> None:
    """As on the blocking store: once a transaction has found the server gone (its pooled
    connection broken, or no connection from the pool within CONNECTION_WAIT, which on this
    store means the pool cannot connect, never that it is busy), a transaction opens a
    connection of its own while the pool has none to give. So an attempt meets the refused
    connection at once instead of waiting 5 s for the pool each time, and the first attempt
    after the server is back succeeds without waiting for the pool's reconnection backoff.
    (The bounds are generous.)"""
    url = own_server.database_url("outage")

    async def main() -> None:
        async with await AsyncPostgresStore.open(url) as store:
            engine = Engine(store, ManualClock())
            if pooled:  # the loop's pool holds a connection the restart breaks
                await engine.create_queue("orders", QueueOptions())
            restart = threading.Thread(target=own_server.restart, kwargs={"down_for": 8.0})
            restart.start()
            try:
                await asyncio.sleep(0.5)  # the server is down now
                with pytest.raises(StoreUnavailableError):  # finds it gone
                    await engine.create_queue("orders", QueueOptions())
                began = time.monotonic()
                with pytest.raises(StoreUnavailableError):
                    await engine.create_queue("orders", QueueOptions())
                assert time.monotonic() - began < 2.5
            finally:
                await asyncio.to_thread(restart.join)
            if not pooled:
                await engine.create_queue("orders", QueueOptions())
            await engine.send("orders", [Message(body=b"y")])
            assert (await engine.counts("orders"))["active"] == 1

    asyncio.run(main())


def test_the_blocking_store_still_runs_the_same_transactions_with_drive(pg_url: str) -> None:
    """The blocking store's transactions run through the same code with no event loop."""
    with PostgresStore.from_url(pg_url) as store:
        engine = Engine(store, ManualClock())
        drive(engine.create_queue("orders", QueueOptions()))
        seqs = drive(engine.send("orders", [Message(body=b"a"), Message(body=b"b")]))
        got = drive(engine.receive("orders", 5))
        drive(engine.complete("orders", [(m.sequence_number, m.lock_token) for m in got]))
        assert [m.sequence_number for m in got] == seqs
        assert drive(engine.audit()).ok


def test_one_store_under_one_asyncio_run_after_another_keeps_one_loops_connections(
    pg_url: str,
) -> None:
    """A store used under one ``asyncio.run`` after another opens a pool on each loop (a
    pool belongs to its loop) and closes the connections of the pool whose loop has gone:
    the server holds no more of its connections after ten loops than after two."""
    blocking = PostgresStore.from_url(pg_url)
    store = AsyncPostgresStore.beside(blocking, max_size=3)
    engine = Engine(store, ManualClock())

    def connections() -> int:
        """The server's client connections to the database, but the one asking."""
        with psycopg.connect(blocking.conninfo, autocommit=True) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert found is not None
        return int(found[0])

    async def busy() -> None:  # six sends at once on a pool of three
        await asyncio.gather(*(engine.send("orders", [Message(body=b"x")]) for _ in range(6)))

    try:
        asyncio.run(engine.create_queue("orders", QueueOptions()))
        asyncio.run(busy())
        after_two = connections()
        for _ in range(8):
            asyncio.run(busy())
        assert connections() <= after_two
        assert drive(Engine(blocking, ManualClock()).counts("orders"))["active"] == 54
    finally:
        asyncio.run(store.aclose())
        blocking.close()
