"""poisonq.aio: the sync API's rules through the asyncio API on both stores (the state
machine, poison, settlement errors, sessions, renewal, resubmit), and what the asyncio API
adds: waits that hold no thread, and cancellation that leaves nothing locked."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import poisonq
from poisonq import (
    BrokerClosedError,
    DeadLetterReason,
    InvalidOptionError,
    ManualClock,
    Message,
    MessageLockLostError,
    MessageState,
    PermanentError,
)
from poisonq.aio import AsyncBroker, AutoLockRenewer, Processor
from poisonq.aio.calls import to_the_end
from tests.helpers import assert_balanced

Body = Callable[[AsyncBroker], Awaitable[None]]


def run(url: str, clock: ManualClock, body: Body) -> None:
    """Run ``body`` on a fresh event loop with an async broker on ``url``, then check the
    ledger through the sync API."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock) as broker:
            await broker.create_queue("orders", max_delivery_count=3, lock_duration=30)
            await body(broker)
            assert_balanced(broker.sync)

    asyncio.run(main())


async def cancel_run(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and see it end cancelled."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def complete_the_rest(broker: AsyncBroker, queue: str, count: int) -> None:
    """Complete the ``count`` messages a test left in ``queue`` (the ledger is checked after)."""
    receiver = broker.receiver(queue)
    await receiver.complete(await receiver.receive(max_messages=count))


def test_peek_lock_then_complete_moves_messages_through_the_state_machine(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        seqs = await broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
        receiver = broker.receiver("orders")
        got = await receiver.receive(max_messages=5)
        assert [m.sequence_number for m in got] == seqs
        assert all(m.state is MessageState.LOCKED and m.delivery_count == 1 for m in got)
        assert (await broker.counts("orders"))["locked"] == 2
        await receiver.complete(got)
        assert (await broker.counts("orders"))["locked"] == 0
        assert await receiver.receive() == []

    run(url, clock, body)


def test_abandon_past_max_delivery_count_dead_letters_with_the_brokers_reason(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        (seq,) = await broker.sender("orders").send(Message(body=b"x"))
        receiver = broker.receiver("orders")
        poisoned: list[int] = []
        for _ in range(3):
            (message,) = await receiver.receive()
            poisoned = await receiver.abandon(message, ValueError("bad"))
        assert poisoned == [seq]
        (dead,) = await broker.dead_letters("orders")
        assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED

    run(url, clock, body)


def test_settling_after_the_lock_ran_out_raises_message_lock_lost(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send(Message(body=b"x"))
        receiver = broker.receiver("orders")
        (message,) = await receiver.receive()
        clock.advance(31)
        with pytest.raises(MessageLockLostError):
            await receiver.complete(message)
        (again,) = await receiver.receive()
        assert again.delivery_count == 2
        await receiver.complete(again)

    run(url, clock, body)


def test_a_deferred_message_is_received_again_by_sequence_number(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        (seq,) = await broker.sender("orders").send(Message(body=b"x"))
        receiver = broker.receiver("orders")
        await receiver.defer(await receiver.receive())
        assert await receiver.receive() == []
        (message,) = await receiver.receive_deferred(seq)
        assert message.state is MessageState.LOCKED
        await receiver.dead_letter(message, reason="Unfixable")
        assert (await broker.dead_letters("orders"))[0].dead_letter_reason == "Unfixable"

    run(url, clock, body)


def test_bad_input_raises_the_sync_apis_typed_errors(url: str, clock: ManualClock) -> None:
    async def body(broker: AsyncBroker) -> None:
        with pytest.raises(InvalidOptionError):
            broker.receiver("orders", receive_mode="bogus")
        with pytest.raises(InvalidOptionError):  # a sync renewer cannot be driven by the loop
            broker.receiver("orders", auto_lock_renewer=poisonq.AutoLockRenewer())  # type: ignore[arg-type]
        with pytest.raises(InvalidOptionError):
            await broker.sender("orders").send("not a message")  # type: ignore[arg-type]
        with pytest.raises(poisonq.EntityNotFoundError):
            await broker.get_queue("missing")

    run(url, clock, body)


def test_a_waiting_receive_does_not_block_other_coroutines(url: str, clock: ManualClock) -> None:
    """The receive waits in the event loop: the send it waits for runs meanwhile, on the
    same (for SQLite: the only) store thread."""

    async def body(broker: AsyncBroker) -> None:
        waiting = asyncio.create_task(broker.receiver("orders").receive(max_wait=60))
        await asyncio.sleep(0)
        await broker.sender("orders").send(Message(body=b"late"))
        (message,) = await waiting
        assert message.body == b"late"
        await broker.receiver("orders").complete(message)

    run(url, clock, body)


def test_cancelling_a_waiting_receive_leaves_nothing_locked(url: str, clock: ManualClock) -> None:
    async def body(broker: AsyncBroker) -> None:
        receiver = broker.receiver("orders")
        waiting = [asyncio.create_task(receiver.receive(max_wait=60)) for _ in range(5)]
        await asyncio.sleep(0.05)  # let them reach the store and wait
        await broker.sender("orders").send([Message(body=b"x") for _ in range(3)])
        for task in waiting:
            task.cancel()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        taken = [m for r in results if isinstance(r, list) for m in r]
        counts = await broker.counts("orders")
        assert counts["locked"] == len(taken)  # only what a finished receive handed out
        rest = await receiver.receive(max_messages=10)
        assert len(taken) + len(rest) == 3
        assert all(m.delivery_count == 1 for m in rest)  # given back uncounted
        await receiver.complete(taken + rest)

    run(url, clock, body)


def test_a_wait_cancelled_in_the_turn_its_change_arrives_is_still_cancelled(
    url: str, clock: ManualClock
) -> None:
    """A cancellation is never lost to the change (or the timeout) that ends a wait in the
    same turn of the loop: the waiting receive is cancelled, not woken as if nothing came
    and left to wait on to its ``max_wait`` (``asyncio.wait_for`` before Python 3.12)."""

    async def body(broker: AsyncBroker) -> None:
        marker = broker.changes.marker()
        waiting = asyncio.create_task(broker.changes.wait(marker, 10))
        await asyncio.sleep(0)  # it waits for the marker
        marker.set()  # a change, and in the same turn the caller's cancellation
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    run(url, clock, body)


@pytest.mark.parametrize("sessions", [False, True], ids=["queue", "session queue"])
def test_cancelling_an_idle_processor_ends_its_run(
    url: str, clock: ManualClock, sessions: bool
) -> None:
    """A run waiting on an idle queue ends with the cancellation (``asyncio.wait_for``
    around it, a TaskGroup sibling's failure, the Ctrl-C ``asyncio.run`` turns into one),
    not only with ``stop()``."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("idle", requires_session=sessions)
        processor = Processor(broker, "idle", lambda message: None, concurrency=2, max_wait=3)
        run_task = asyncio.create_task(processor.run())
        await asyncio.sleep(0.2)  # it waits for a message (or a session)
        await cancel_run(run_task)

    run(url, clock, body)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_cancelled_processor_gives_back_at_once_what_its_hung_handlers_hold(
    url: str, clock: ManualClock, concurrency: int
) -> None:
    """Cancelling a run (a shutdown, ``asyncio.wait_for`` around it) while handlers hang is
    not a failed delivery: their messages go back at once with the delivery count as it was,
    nothing left locked to wait for its lock to run out."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=f"{n}") for n in range(6)])
        running = 0

        async def hang(message: poisonq.ReceivedMessage) -> None:
            nonlocal running
            running += 1
            await asyncio.Event().wait()  # never returns

        processor = Processor(broker, "orders", hang, concurrency=concurrency, batch_size=2)
        run_task = asyncio.create_task(processor.run())
        while running < concurrency:
            await asyncio.sleep(0.01)
        await cancel_run(run_task)
        counts = await broker.counts("orders")
        assert (counts["locked"], counts["active"]) == (0, 6)
        assert {m.delivery_count for m in await broker.peek("orders", max_messages=6)} == {0}
        await complete_the_rest(broker, "orders", 6)

    run(url, clock, body)


def test_a_run_cancelled_while_it_holds_sessions_open_lets_every_one_go(
    url: str, clock: ManualClock
) -> None:
    """A run cancelled (and cancelled again) while it holds sessions open lets every one
    go with its messages: the failures held back for the defect window settled as
    failures, the rest given back uncounted, nothing locked for nobody."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("accounts", requires_session=True, lock_duration=30)
        await broker.sender("accounts").send(
            [Message(body=f"{n}", session_id=f"s{a}") for a in range(5) for n in range(3)]
        )
        seen: list[str] = []
        hanging = asyncio.Event()

        async def handle(message: poisonq.ReceivedMessage) -> None:
            if message.session_id not in seen:
                seen.append(message.session_id)
            if len(seen) < 5:  # the first four sessions fail, held open while undecided
                raise KeyError(message.session_id)
            hanging.set()
            await asyncio.Event().wait()  # the fifth hangs

        processor = Processor(broker, "accounts", handle, batch_size=3, max_wait=0)
        run_task = asyncio.create_task(processor.run())
        await hanging.wait()
        for _ in range(10_000):  # bounded: each turn of the loop, another cancellation
            if run_task.done():
                break
            run_task.cancel()
            await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await run_task
        counts = await broker.counts("accounts")
        assert (counts["locked"], counts["active"]) == (0, 15)
        counted = [m.delivery_count for m in await broker.peek("accounts", max_messages=15)]
        assert sorted(counted) == [0] * 11 + [1] * 4  # the four first messages that failed
        for _ in range(5):  # and every session free to accept again
            session = await broker.accept_next_session("accounts", max_wait=0)
            assert session is not None
            await session.complete(await session.receive(max_messages=3))
            await session.close()

    run(url, clock, body)


async def _suspects_with_a_run_alone_waiting(
    broker: AsyncBroker, clock: ManualClock
) -> tuple[Processor, asyncio.Task[Any], asyncio.Event]:
    """A queue whose two oldest messages are suspects (their locks ran out, as under a
    crashed consumer) and two fresh ones; a run of two tasks where one holds the fresh ones
    in a handler that waits for the returned event, and the other has claimed the gate to
    run a suspect alone once the first lets go."""
    await broker.create_queue("suspects", lock_duration=30, max_delivery_count=5)
    await broker.sender("suspects").send([Message(body=f"m{n}") for n in range(4)])
    assert len(await broker.receiver("suspects").receive(max_messages=2)) == 2
    clock.advance(31)  # the crashed consumer's locks run out: m0 and m1 are suspects
    handling = asyncio.Event()
    release = asyncio.Event()

    async def handle(message: poisonq.ReceivedMessage) -> None:
        handling.set()
        await release.wait()

    processor = Processor(broker, "suspects", handle, concurrency=2, batch_size=2, max_wait=0)
    run_task = asyncio.create_task(processor.run())
    await handling.wait()
    for _ in range(100):  # bounded: the other task reaches the gate and waits there
        await asyncio.sleep(0)
    return processor, run_task, release


@pytest.mark.parametrize("how", ["stop", "cancel"])
def test_a_run_stopped_or_cancelled_while_a_suspect_waits_to_run_alone_gives_it_back(
    url: str, clock: ManualClock, how: str
) -> None:
    """A suspect waiting for the other tasks to let go, when the run is stopped or
    cancelled, goes back uncounted (its delivery count as the crash left it) and the run
    ends: a crash costs a suspect a delivery, a shutdown does not."""

    async def body(broker: AsyncBroker) -> None:
        processor, run_task, release = await _suspects_with_a_run_alone_waiting(broker, clock)
        if how == "stop":
            processor.stop()
            release.set()
            await run_task
        else:
            await cancel_run(run_task)
        counts = await broker.counts("suspects")
        assert counts["locked"] == 0
        counted = {m.text: m.delivery_count for m in await broker.peek("suspects", max_messages=10)}
        assert counted["m0"] == counted["m1"] == 1  # the crash's delivery, and no other
        await complete_the_rest(broker, "suspects", 10)

    run(url, clock, body)


def test_a_handler_that_swallows_the_cancellation_does_not_keep_the_run_going(
    url: str, clock: ManualClock
) -> None:
    """A run cancelled while its handler catches the ``CancelledError`` and returns ends
    when that handler returns: the message it handled is settled by its outcome, the rest
    of the batch goes back uncounted, and no handler is called after."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=f"{n}") for n in range(6)])
        calls = 0
        handling = asyncio.Event()

        async def swallow(message: poisonq.ReceivedMessage) -> None:
            nonlocal calls
            calls += 1
            handling.set()
            with contextlib.suppress(asyncio.CancelledError):  # "clean up", not re-raised
                await asyncio.Event().wait()

        run_task = asyncio.create_task(Processor(broker, "orders", swallow, batch_size=3).run())
        await handling.wait()
        run_task.cancel()
        done, _ = await asyncio.wait([run_task], timeout=10)  # bounded: it must end
        assert run_task in done and run_task.cancelled()
        assert calls == 1
        counts = await broker.counts("orders")
        assert (counts["completed"], counts["locked"], counts["active"]) == (1, 0, 5)
        assert {m.delivery_count for m in await broker.peek("orders", max_messages=6)} == {0}
        await complete_the_rest(broker, "orders", 6)

    run(url, clock, body)


@pytest.mark.parametrize("sessions", [False, True], ids=["queue", "session queue"])
def test_stop_ends_a_run_waiting_for_messages_without_waiting_out_max_wait(
    url: str, clock: ManualClock, sessions: bool
) -> None:
    """stop() ends a run that waits on an idle queue at once, not after its ``max_wait``
    (a shutdown's grace period is shorter than a long poll)."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("idle", requires_session=sessions)
        processor = Processor(broker, "idle", lambda message: None, concurrency=2, max_wait=300)
        run_task = asyncio.create_task(processor.run())
        await asyncio.sleep(0.1)  # it waits for a message (or a session)
        processor.stop()
        done, _ = await asyncio.wait([run_task], timeout=10)  # bounded: well under 300 s
        assert run_task in done
        assert run_task.result().received == 0

    run(url, clock, body)


def test_stop_before_run_is_kept_and_a_later_run_runs(url: str, clock: ManualClock) -> None:
    """A stop() asked for before run() (a shutdown during start-up) makes that run return
    at once with nothing received; the run after it runs as usual."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=f"{n}") for n in range(3)])
        processor = Processor(broker, "orders", lambda message: None, max_wait=0)
        processor.stop()
        assert (await processor.run(until_idle=True)).received == 0
        assert (await processor.run(until_idle=True)).completed == 3

    run(url, clock, body)


def test_an_async_broker_and_its_processor_work_under_one_asyncio_run_after_another(
    url: str, clock: ManualClock
) -> None:
    """An AsyncBroker (and a Processor) used again under a later ``asyncio.run`` waits and
    wakes in that loop: nothing keeps the first loop's events."""
    broker = asyncio.run(poisonq.aio.connect(url, clock=clock))
    asyncio.run(broker.create_queue("orders"))
    processor = Processor(broker, "orders", lambda message: None, max_wait=0.2)

    async def use() -> poisonq.processor.ProcessorStats:
        await broker.sender("orders").send([Message(body=b"x") for _ in range(2)])
        return await processor.run(until_idle=True)

    try:
        for _ in range(3):
            assert asyncio.run(use()).completed == 2
        assert_balanced(broker.sync)
    finally:
        asyncio.run(broker.close())


def test_what_is_run_to_the_end_ends_however_often_its_caller_is_cancelled() -> None:
    """What must not stop half done (settling, giving back what a task holds) is awaited to
    its end through every cancellation of its caller, not only the first (a task group
    cancels a task that may be cleaning up after its own error already); the cancellation
    goes on once it has ended."""
    steps: list[int] = []

    async def work() -> None:
        for step in range(3):
            await asyncio.sleep(0.01)
            steps.append(step)

    async def main() -> None:
        caller = asyncio.create_task(to_the_end(work()))
        for _ in range(3):
            await asyncio.sleep(0.01)
            caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(main())
    assert steps == [0, 1, 2]


def test_each_lock_a_processor_loses_is_reported_once_to_a_coroutine_hook(
    url: str, clock: ManualClock
) -> None:
    """A lock that runs out while the handler runs is logged and given to ``on_lock_lost``
    (here a coroutine function) once per lock, counted as ``lock_lost``, and the message is
    delivered again, until its deliveries are spent."""

    async def body(broker: AsyncBroker) -> None:
        (seq,) = await broker.sender("orders").send(Message(body=b"slow"))
        lost: list[int] = []

        async def handle(message: poisonq.ReceivedMessage) -> None:
            clock.advance(31)  # past its 30 s lock, with no renewal pass between

        async def on_lock_lost(message: poisonq.ReceivedMessage) -> None:
            lost.append(message.sequence_number)

        processor = Processor(broker, "orders", handle, on_lock_lost=on_lock_lost, max_wait=0)
        stats = await processor.run(until_idle=True)
        assert lost == [seq, seq, seq] and stats.lock_lost == 3
        [dead] = await broker.peek("orders/$deadletterqueue")
        assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED

    run(url, clock, body)


def test_a_handler_that_holds_the_event_loop_is_named_in_a_warning_once(
    url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler call that holds the loop (a plain handler's blocking work) for more than a
    second of the broker's clock starves every other task, the lock renewer too: the run
    warns once, naming the message; a handler that awaits its waits is not named."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=b"slow"), Message(body=b"slow")])

        def blocking(message: poisonq.ReceivedMessage) -> None:
            clock.advance(5)  # five seconds of blocking work, as the store's clock sees them

        async def waiting(message: poisonq.ReceivedMessage) -> None:
            await asyncio.sleep(0)
            clock.advance(5)  # after its first await: the loop was free

        with caplog.at_level("WARNING", logger="poisonq.aio.processor"):
            await Processor(broker, "orders", waiting, max_wait=0).run(until_idle=True)
            assert caplog.records == []
            await broker.sender("orders").send([Message(body=b"slow"), Message(body=b"slow")])
            await Processor(broker, "orders", blocking, max_wait=0).run(until_idle=True)
        [warning] = caplog.records
        assert "held the event loop for 5.0 s" in warning.getMessage()
        assert "asyncio.to_thread" in warning.getMessage()

    run(url, clock, body)


def test_a_coroutine_handlers_exception_abandons_until_the_retry_policy_poisons(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        (seq,) = await broker.sender("orders").send(Message(body=b"bad"))
        hooked: list[tuple[int, BaseException]] = []

        async def handler(message: poisonq.ReceivedMessage) -> None:
            await asyncio.sleep(0)
            raise ValueError("cannot parse")

        async def on_poison(message: poisonq.ReceivedMessage, error: BaseException) -> None:
            hooked.append((message.sequence_number, error))

        processor = Processor(broker, "orders", handler, on_poison=on_poison, max_wait=0.2)
        stats = await processor.run(until_idle=True)
        assert (stats.abandoned, stats.poisoned, stats.completed) == (3, 1, 0)
        assert [(s, type(e)) for s, e in hooked] == [(seq, ValueError)]
        (dead,) = await broker.dead_letters("orders")
        assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED

    run(url, clock, body)


def test_a_coroutine_handlers_permanent_error_dead_letters_at_once_and_others_complete(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=b"ok"), Message(body=b"bad")])

        async def handler(message: poisonq.ReceivedMessage) -> None:
            if message.body == b"bad":
                raise PermanentError("no such customer")

        processor = Processor(broker, "orders", handler, concurrency=4, max_wait=0.2)
        stats = await processor.run(until_idle=True)
        assert (stats.completed, stats.dead_lettered, stats.abandoned) == (1, 1, 0)
        (dead,) = await broker.dead_letters("orders")
        assert dead.dead_letter_reason == "PermanentError" and dead.delivery_count == 1

    run(url, clock, body)


def test_sessions_keep_their_order_across_many_concurrent_session_receivers(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("chats", requires_session=True, lock_duration=30)
        sender = broker.sender("chats")
        for n in range(5):
            await sender.send([Message(body=b"%d" % n, session_id=f"s{s}") for s in range(20)])
        seen: dict[str, list[bytes]] = {}

        async def drain() -> None:
            while session := await broker.accept_next_session("chats", max_wait=0.2):
                async with session:
                    while got := await session.receive(max_messages=2):
                        seen.setdefault(session.session_id, []).extend(m.body for m in got)
                        await session.complete(got)

        await asyncio.gather(*(drain() for _ in range(50)))
        assert seen == {f"s{s}": [b"0", b"1", b"2", b"3", b"4"] for s in range(20)}

    run(url, clock, body)


def test_session_state_is_kept_and_the_session_lock_renewed(url: str, clock: ManualClock) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("chats", requires_session=True, lock_duration=30)
        await broker.sender("chats").send(Message(body=b"x", session_id="a"))
        async with await broker.accept_session("chats", "a") as session:
            await session.set_session_state("step 2")
            clock.advance(20)
            await session.renew_session_lock()
            clock.advance(20)  # past the first lock, inside the renewed one
            (message,) = await session.receive()
            await session.complete(message)
        async with await broker.accept_session("chats", "a") as again:
            assert await again.get_session_state() == b"step 2"
        assert again.closed

    run(url, clock, body)


def test_the_auto_lock_renewer_renews_a_lock_past_half_its_duration(
    url: str, clock: ManualClock
) -> None:
    """The renewer's pass is the sync rule; the test runs it instead of waiting for the task."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send(Message(body=b"x"))
        async with AutoLockRenewer(60, check_interval=3600) as renewer:
            receiver = broker.receiver("orders", auto_lock_renewer=renewer)
            (message,) = await receiver.receive()
            first = message.locked_until
            clock.advance(20)
            await renewer.renew_due()
            assert message.locked_until is not None and first is not None
            assert message.locked_until > first
            clock.advance(20)  # past the first lock
            await receiver.complete(message)

    run(url, clock, body)


def test_resubmit_and_purge_run_as_tasks_awaited_in_the_loop(url: str, clock: ManualClock) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=b"a"), Message(body=b"b")])
        receiver = broker.receiver("orders")
        await receiver.dead_letter(await receiver.receive(max_messages=2), reason="Bad")
        task = await broker.resubmit("orders", rate=None, body_contains="a")
        assert task.done == 1
        (back,) = await receiver.receive()
        assert back.body == b"a" and back.delivery_count == 1
        await receiver.complete(back)
        assert (await broker.purge("orders")).done == 1
        assert await broker.count_dead_letters("orders") == 0

    run(url, clock, body)


def test_cancelling_a_waiting_session_accept_leaves_no_session_locked(
    url: str, clock: ManualClock
) -> None:
    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("chats", requires_session=True, lock_duration=30)
        waiting = [
            asyncio.create_task(broker.accept_next_session("chats", max_wait=60)) for _ in range(3)
        ]
        await asyncio.sleep(0.05)  # let them reach the store and wait
        await broker.sender("chats").send(Message(body=b"x", session_id="a"))
        for task in waiting:
            task.cancel()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        for accepted in results:
            if isinstance(accepted, poisonq.aio.AsyncSessionReceiver):
                await accepted.close()  # a finished accept handed its session out
        async with await broker.accept_session("chats", "a") as session:
            (message,) = await session.receive()
            assert message.delivery_count == 1
            await session.complete(message)

    run(url, clock, body)


@pytest.mark.parametrize("batch", [False, True])
def test_a_cancelled_error_escaping_a_handler_is_its_failure_when_the_run_is_not_cancelled(
    url: str, clock: ManualClock, batch: bool
) -> None:
    """Only a cancellation of the run itself ends the run: a ``CancelledError`` the handler
    lets escape (a sub-task it cancelled) while the run is not being cancelled is the
    handler's failure like any exception, so the message is abandoned with its failure
    recorded until the retry policy dead-letters it, and the other messages are handled
    (with a batch handler, bisection finds the one message)."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=f"{n}") for n in range(6)])

        async def leaks_a_cancel(message: poisonq.ReceivedMessage) -> None:
            if message.body == b"2":
                inner = asyncio.create_task(asyncio.sleep(5))
                await asyncio.sleep(0)
                inner.cancel()
                await inner  # the handler's own sub-task was cancelled: the error escapes

        async def batch_leaks_a_cancel(messages: list[poisonq.ReceivedMessage]) -> None:
            for message in messages:
                await leaks_a_cancel(message)

        handler = batch_leaks_a_cancel if batch else leaks_a_cancel
        processor = Processor(broker, "orders", handler, batch=batch, concurrency=2, max_wait=0)
        stats = await processor.run(until_idle=True)
        assert (stats.completed, stats.poisoned) == (5, 1)
        (dead,) = await broker.dead_letters("orders")
        assert dead.body == b"2"
        assert dead.dead_letter_reason == DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED
        assert [f.error_type for f in dead.failures] == ["asyncio.exceptions.CancelledError"] * 3
        counts = await broker.counts("orders")
        assert (counts["active"], counts["locked"]) == (0, 0)

    run(url, clock, body)


def tasks_left() -> set[asyncio.Task[Any]]:
    """The running loop's tasks but this one and the connection pool's own (psycopg's pool
    keeps workers, and its scheduler waits for an event in a task of ``asyncio.wait_for``)."""

    def pools(task: asyncio.Task[Any]) -> bool:
        frames = task.get_stack()
        return any("psycopg_pool" in frame.f_code.co_filename for frame in frames) or (
            task.get_coro().__qualname__ == "Event.wait"  # type: ignore[union-attr]
        )

    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not pools(t)}


@pytest.mark.parametrize("sessions", [False, True])
def test_a_cancelled_batch_run_calls_no_handler_after_the_cancellation(
    url: str, clock: ManualClock, sessions: bool
) -> None:
    """Cancelling a ``batch=True`` run cancels the handler call in flight and stops the
    batch's search (bisection, a session's first-failure search) before its next call: once
    ``run()`` has ended, no handler call, search thread or task of it is left running, and
    the batch is back in the queue uncounted for another consumer."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("batches", requires_session=sessions, lock_duration=30)
        session = "s" if sessions else None
        await broker.sender("batches").send(
            [Message(body=f"{n}", session_id=session) for n in range(4)]
        )
        calls: list[list[bytes]] = []
        cancelled: list[list[bytes]] = []
        started, release = asyncio.Event(), asyncio.Event()

        async def fails_as_a_batch(messages: list[poisonq.ReceivedMessage]) -> None:
            bodies = [m.body for m in messages]
            calls.append(bodies)
            started.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                cancelled.append(bodies)
                raise
            if len(messages) > 1:
                raise RuntimeError("the batch fails: the search would bisect it")

        processor = Processor(broker, "batches", fails_as_a_batch, batch=True, batch_size=4)
        run_task = asyncio.create_task(processor.run())
        await started.wait()
        await cancel_run(run_task)
        assert tasks_left() == set()  # nothing of the run left
        release.set()
        await asyncio.sleep(0)
        assert calls == cancelled == [[b"0", b"1", b"2", b"3"]]
        counts = await broker.counts("batches")
        assert (counts["locked"], counts["active"]) == (0, 4)
        assert {m.delivery_count for m in await broker.peek("batches", max_messages=4)} == {0}

    run(url, clock, body)


def test_a_closed_async_broker_raises_broker_closed_error_also_in_a_waiting_receive(
    url: str, clock: ManualClock
) -> None:
    """A closed :class:`AsyncBroker` raises :class:`BrokerClosedError`, as the sync Broker
    does (not asyncio's "cannot schedule new futures after shutdown"): for a call made after
    the close, and for a receive that was waiting while its broker closed."""

    async def main() -> None:
        broker = await poisonq.aio.connect(url, clock=clock)
        await broker.create_queue("orders")
        waiting = asyncio.create_task(broker.receiver("orders").receive(max_wait=30))
        await asyncio.sleep(0.2)  # it waits for a message (the rule holds either way)
        assert_balanced(broker.sync)
        await broker.close()
        with pytest.raises(BrokerClosedError):
            await waiting
        with pytest.raises(BrokerClosedError):
            await broker.counts("orders")
        with pytest.raises(BrokerClosedError):
            await broker.sender("orders").send(Message(body=b"late"))
        with pytest.raises(BrokerClosedError):
            await broker.receiver("orders").receive(max_wait=0)

    asyncio.run(main())


def test_an_on_poison_hook_that_raises_ends_the_run_with_its_error_after_the_dead_letter(
    url: str, clock: ManualClock
) -> None:
    """As in the sync Processor, ``on_poison`` runs after the settlement that poisoned the
    message: a hook that raises ends ``run()`` with the hook's exception, the message stays
    dead-lettered, and nothing is left locked (what was in hand is settled or given back)."""

    async def body(broker: AsyncBroker) -> None:
        await broker.sender("orders").send([Message(body=f"{n}") for n in range(4)])

        async def handler(message: poisonq.ReceivedMessage) -> None:
            if message.body == b"1":
                raise PermanentError("no such customer")

        async def alerting_is_down(message: poisonq.ReceivedMessage, error: BaseException) -> None:
            raise RuntimeError("alerting service down")

        processor = Processor(broker, "orders", handler, on_poison=alerting_is_down, max_wait=0)
        with pytest.raises(RuntimeError, match="alerting service down"):
            await processor.run(until_idle=True)
        (dead,) = await broker.dead_letters("orders")
        assert dead.body == b"1" and dead.dead_letter_reason == "PermanentError"
        assert (await broker.counts("orders"))["locked"] == 0

    run(url, clock, body)


def test_a_cancelled_send_is_applied_all_or_nothing_and_nothing_while_it_waited_its_turn(
    url: str, clock: ManualClock
) -> None:
    """A cancelled send is never applied in part: one cancelled while it waited for its turn
    (a store thread, or on PostgreSQL one of the loop's ``pool_size`` calls) sends nothing;
    one cancelled once its call began sends every message of the batch (the call runs to
    its end), though the caller got the cancellation, so a retry after a timeout may send
    twice (what the docs say; duplicate detection is the remedy)."""

    async def main() -> None:
        async with await poisonq.aio.connect(url, clock=clock, pool_size=1) as broker:
            await broker.create_queue("orders")
            batch = [Message(body=f"{n}") for n in range(300)]
            await cancelled_while_it_waits_its_turn(broker, batch)
            assert (await broker.counts("orders"))["active"] == 0
            for _ in range(5):  # the transaction may have begun
                sending = asyncio.create_task(broker.sender("orders").send(batch))
                await asyncio.sleep(0)
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
                await broker.calls.finish()  # after the send's task is done (PostgreSQL)
                await broker.calls(lambda: None)  # after the send's thread is done (SQLite)
                assert (await broker.counts("orders"))["active"] % 300 == 0
            assert_balanced(broker.sync)

    async def cancelled_while_it_waits_its_turn(broker: AsyncBroker, batch: list[Message]) -> None:
        """A send cancelled while the broker's one turn is taken."""
        if broker.native is None:
            thread_free = threading.Event()
            busy = asyncio.ensure_future(broker.calls(thread_free.wait))  # the store thread
            release = thread_free.set
        else:
            turn_free = asyncio.Event()
            busy = asyncio.ensure_future(broker.calls.run(turn_free.wait))  # the loop's turn
            release = turn_free.set
        await asyncio.sleep(0)
        sending = asyncio.create_task(broker.sender("orders").send(batch))
        await asyncio.sleep(0)  # its first step waits for the turn
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        release()
        await busy
        await broker.calls.finish()  # a send's task that did run (PostgreSQL) has ended

    asyncio.run(main())


def test_an_async_sender_or_receiver_refuses_every_call_after_its_async_with(
    url: str, clock: ManualClock
) -> None:
    """As the sync ones: after ``async with`` a sender sends nothing and a receiver locks
    nothing (a message it took would stay locked, held by nothing)."""

    async def body(broker: AsyncBroker) -> None:
        async with broker.sender("orders") as sender:
            await sender.send(Message(body=b"a"))
        async with broker.receiver("orders") as receiver:
            pass
        with pytest.raises(poisonq.InvalidOperationError, match="closed"):
            await sender.send(Message(body=b"b"))
        with pytest.raises(poisonq.InvalidOperationError, match="closed"):
            await receiver.receive(max_messages=1)
        assert (await broker.counts("orders"))["active"] == 1
        [message] = await broker.receiver("orders").receive(max_messages=1)
        await broker.receiver("orders").complete(message)

    run(url, clock, body)


def test_an_async_sender_or_receiver_closed_by_close_refuses_every_call_and_keeps_locks(
    url: str, clock: ManualClock
) -> None:
    """``close()`` closes as leaving ``async with`` does; closing twice does nothing; a
    message the receiver held stays locked until its lock runs out, then comes again."""

    async def body(broker: AsyncBroker) -> None:
        sender = broker.sender("orders")
        await sender.send(Message(body=b"a"))
        await sender.close()
        await sender.close()
        receiver = broker.receiver("orders")
        [held] = await receiver.receive(max_messages=1)
        await receiver.close()
        await receiver.close()
        with pytest.raises(poisonq.InvalidOperationError, match="closed"):
            await sender.send(Message(body=b"b"))
        with pytest.raises(poisonq.InvalidOperationError, match="closed"):
            await receiver.receive(max_messages=1)
        assert (await broker.counts("orders"))["locked"] == 1
        clock.advance(31)  # past the 30 s lock
        [again] = await broker.receiver("orders").receive(max_messages=1)
        assert (again.sequence_number, again.delivery_count) == (held.sequence_number, 2)
        await broker.receiver("orders").complete(again)

    run(url, clock, body)


def test_a_coroutine_on_lock_lost_hook_that_raises_is_logged_and_the_run_goes_on(
    url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Its error is logged with its traceback, naming the hook and the message; the
    message comes again and is completed."""

    async def body(broker: AsyncBroker) -> None:
        (seq,) = await broker.sender("orders").send(Message(body=b"slow"))

        async def handle(message: poisonq.ReceivedMessage) -> None:
            if message.delivery_count == 1:
                clock.advance(31)  # past its 30 s lock, with no renewal pass between

        async def report_lost(message: poisonq.ReceivedMessage) -> None:
            raise RuntimeError("the pager is down")

        processor = Processor(broker, "orders", handle, on_lock_lost=report_lost, max_wait=0)
        stats = await processor.run(until_idle=True)
        assert (stats.lock_lost, stats.completed) == (1, 1)
        [logged] = [r for r in caplog.records if r.levelname == "ERROR"]
        assert "report_lost" in logged.getMessage()
        assert f"message {seq} of orders" in logged.getMessage()
        assert logged.exc_info is not None and "the pager is down" in str(logged.exc_info[1])

    run(url, clock, body)


def test_receivers_accepting_the_next_session_at_once_each_get_a_different_one(
    url: str, clock: ManualClock
) -> None:
    """Forty receivers that look for the next session at the same moment (on PostgreSQL,
    forty transactions at once on the pool) each lock a session of their own at their first
    look: none is refused because another picked the same session a moment before."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("chats", requires_session=True)
        await broker.sender("chats").send(
            [Message(body=b"%d" % n, session_id=f"s{s}") for s in range(40) for n in range(2)]
        )
        got = await asyncio.gather(
            *(broker.accept_next_session("chats", max_wait=0) for _ in range(40))
        )
        assert None not in got
        assert sorted(r.session_id for r in got if r) == sorted(f"s{s}" for s in range(40))
        for receiver in got:
            assert receiver is not None
            async with receiver:
                messages = await receiver.receive(max_messages=2)
                assert [m.body for m in messages] == [b"0", b"1"]
                await receiver.complete(messages)

    run(url, clock, body)


def test_a_session_accepted_while_others_look_for_one_is_received_in_order(
    url: str, clock: ManualClock
) -> None:
    """A receiver that receives its session while other receivers are still looking for the
    next free one gets the session's messages in order, none passed by: on PostgreSQL a look
    holds the row of the message it picked a session by until it commits, and a session's
    receive skipped such a row (SKIP LOCKED), delivering the messages after it first."""

    async def body(broker: AsyncBroker) -> None:
        await broker.create_queue("pay", requires_session=True)
        await broker.sender("pay").send(
            [Message(body=b"%d" % n, session_id=f"s{s}") for s in range(60) for n in range(10)]
        )
        batches: list[list[int]] = []

        async def worker() -> None:
            while (session := await broker.accept_next_session("pay", max_wait=0)) is not None:
                async with session:
                    messages = await session.receive(max_messages=10)
                    batches.append([int(m.body) for m in messages])
                    await session.complete(messages)

        await asyncio.gather(*(worker() for _ in range(20)))
        assert len(batches) == 60
        assert all(batch == list(range(10)) for batch in batches), batches

    run(url, clock, body)
