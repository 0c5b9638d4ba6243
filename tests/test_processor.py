"""The Processor: outcomes become settlements, locks are renewed, failing batches bisected."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import poisonq
import poisonq.aio
from poisonq import Broker, ManualClock, Message, Processor, ReceivedMessage
from poisonq.failures import dead_lettering
from tests.aio_driver import processor
from tests.helpers import assert_balanced

BOTH_APIS = True  # each test with `broker` runs through the sync API and poisonq.aio (conftest)
SYNC_ONLY = {
    "test_stop_from_another_thread_ends_a_run_waiting_for_messages": "stop() from a thread;"
    " the asyncio Processor's stop() is called on its loop (tests/test_aio.py has its own)",
    "test_concurrent_pumps_complete_each_message_once": "threads; the asyncio Processor's"
    " concurrency is tasks",
    "test_locks_are_renewed_while_the_handler_runs": "a plain handler that blocks waits for"
    " the renewer, which the asyncio Processor runs on the loop the handler blocks",
}


class InvalidCustomer(poisonq.PermanentError):
    pass


def send(broker: Broker, queue: str, count: int) -> None:
    broker.sender(queue).send(
        [Message(body=str(n).encode(), message_id=f"m{n}") for n in range(count)]
    )


def dead(broker: Broker, queue: str) -> list[ReceivedMessage]:
    return broker.peek(f"{queue}/$deadletterqueue", max_messages=1000)


def test_a_handler_that_returns_completes(broker: Broker, queue: str) -> None:
    send(broker, queue, 25)
    seen: Counter[str] = Counter()
    stats = processor(
        broker, queue, lambda m: seen.update([m.message_id]), batch_size=10, max_wait=0
    ).run(until_idle=True)
    assert seen == Counter({f"m{n}": 1 for n in range(25)})
    assert (stats.received, stats.completed, stats.handler_runs) == (25, 25, 25)
    assert broker.counts(queue)["completed"] == 25
    assert_balanced(broker)


def test_a_permanent_error_dead_letters_at_once_with_type_and_traceback(
    broker: Broker, queue: str
) -> None:
    send(broker, queue, 3)

    def handle(message: ReceivedMessage) -> None:
        if message.message_id == "m1":
            raise InvalidCustomer("customer 17 does not exist")

    poisoned: list[tuple[str, BaseException]] = []
    stats = processor(
        broker, queue, handle, max_wait=0, on_poison=lambda m, e: poisoned.append((m.message_id, e))
    ).run(until_idle=True)

    [message] = dead(broker, queue)
    assert message.message_id == "m1"
    assert message.delivery_count == 1  # no retry: fail fast
    assert message.dead_letter_reason == "InvalidCustomer"
    # One line (the traceback is in the failure history), as on every path.
    assert message.dead_letter_error_description == (
        "tests.test_processor.InvalidCustomer: customer 17 does not exist"
    )
    detail = broker.message(f"{queue}/$deadletterqueue", message.sequence_number)
    assert detail.failures[-1].error_type.endswith("InvalidCustomer")
    # The history starts at the user's frame, not at the Processor's (it did before).
    first_frame = detail.failures[-1].traceback.splitlines()[1]
    assert first_frame.endswith(", in handle") and "test_processor.py" in first_frame
    assert [(mid, type(e)) for mid, e in poisoned] == [("m1", InvalidCustomer)]
    assert (stats.completed, stats.dead_lettered, stats.poisoned) == (2, 1, 1)
    assert_balanced(broker)


def test_a_chained_permanent_error_is_dead_lettered_by_its_root_cause_as_everywhere(
    broker: Broker, queue: str
) -> None:
    send(broker, queue, 1)

    def handle(message: ReceivedMessage) -> None:
        try:
            {}["C17"]
        except KeyError as exc:
            raise poisonq.PermanentError("order 17: unknown customer") from exc

    processor(broker, queue, handle, max_wait=0).run(until_idle=True)

    [message] = dead(broker, queue)
    failure = broker.message(f"{queue}/$deadletterqueue", message.sequence_number).failures[-1]
    # The same rule as the pipeline's workers, which have only the failure record.
    expected = dead_lettering(message.sequence_number, "token", failure)
    assert (message.dead_letter_reason, message.dead_letter_error_description) == (
        expected.reason,
        expected.description,
    )
    assert message.dead_letter_reason == "KeyError"


def test_types_listed_as_permanent_dead_letter_at_once(broker: Broker, queue: str) -> None:
    send(broker, queue, 1)

    def handle(message: ReceivedMessage) -> None:
        raise ValueError("not a number")

    processor(broker, queue, handle, permanent=[ValueError], max_wait=0).run(until_idle=True)
    [message] = dead(broker, queue)
    assert (message.dead_letter_reason, message.delivery_count) == ("ValueError", 1)


def test_a_transient_error_is_retried_then_completed(broker: Broker, queue: str) -> None:
    send(broker, queue, 4)
    attempts: Counter[str] = Counter()

    def handle(message: ReceivedMessage) -> None:
        attempts[message.message_id] += 1
        if message.message_id == "m2" and message.delivery_count == 1:
            raise TimeoutError("database is locked")

    stats = processor(broker, queue, handle, batch_size=4, max_wait=0).run(until_idle=True)
    assert attempts == Counter({"m0": 1, "m1": 1, "m2": 2, "m3": 1})
    assert (stats.completed, stats.abandoned, stats.poisoned) == (4, 1, 0)
    assert dead(broker, queue) == []
    assert_balanced(broker)


def test_an_always_failing_message_is_poisoned_by_the_retry_policy(
    broker: Broker, queue: str
) -> None:
    send(broker, queue, 2)

    def handle(message: ReceivedMessage) -> None:
        if message.message_id == "m0":
            raise KeyError(f"attempt {message.delivery_count}")

    poisoned: list[str] = []
    stats = processor(
        broker, queue, handle, max_wait=0, on_poison=lambda m, e: poisoned.append(m.message_id)
    ).run(until_idle=True)

    [message] = dead(broker, queue)
    assert message.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert "attempt 3" in (message.dead_letter_error_description or "")
    history = broker.message(f"{queue}/$deadletterqueue", message.sequence_number).failures
    assert [f.error_type for f in history] == ["KeyError"] * 3
    assert poisoned == ["m0"]
    assert (stats.abandoned, stats.poisoned, stats.completed) == (3, 1, 1)
    assert_balanced(broker)


def bisection_bound(n: int, k: int) -> int:
    """Runs bisection may take for k failing messages among n: the first run, then at most
    two runs per level of the tree for each failing message."""
    return 1 + 2 * k * math.ceil(math.log2(n))


@pytest.mark.parametrize(
    ("n", "bad"),
    [(64, {17}), (64, {0, 63}), (64, {5, 6, 7}), (100, {3, 50, 51, 97}), (7, {6}), (1, {0})],
)
def test_a_failing_batch_is_bisected_and_only_the_guilty_count_an_attempt(
    broker: Broker, queue: str, n: int, bad: set[int]
) -> None:
    send(broker, queue, n)
    runs = 0
    succeeded: Counter[int] = Counter()

    def handle(batch: list[ReceivedMessage]) -> None:
        nonlocal runs
        runs += 1
        pump.stop()  # one batch only: settle it, then return
        if guilty := [m.message_id for m in batch if int(m.body) in bad]:
            raise RuntimeError(f"cannot process {guilty}")
        succeeded.update(int(m.body) for m in batch)

    pump = processor(broker, queue, handle, batch=True, batch_size=n, max_wait=0)
    stats = pump.run()

    assert runs == stats.handler_runs <= bisection_bound(n, len(bad))
    assert succeeded == Counter(set(range(n)) - bad)  # each good message completed once
    assert (stats.completed, stats.abandoned) == (n - len(bad), len(bad))
    left = broker.peek(queue, max_messages=n)
    assert sorted(int(m.body) for m in left) == sorted(bad)
    for message in left:
        detail = broker.message(queue, message.sequence_number)
        assert [f.error_type for f in detail.failures] == ["RuntimeError"]
        assert f"m{int(message.body)}" in detail.failures[0].message
    assert_balanced(broker)


def test_a_permanent_error_in_a_batch_dead_letters_only_the_guilty(
    broker: Broker, queue: str
) -> None:
    send(broker, queue, 16)

    def handle(batch: list[ReceivedMessage]) -> None:
        if any(m.message_id == "m9" for m in batch):
            raise InvalidCustomer("m9")

    stats = processor(broker, queue, handle, batch=True, batch_size=16, max_wait=0).run(
        until_idle=True
    )
    assert [(m.message_id, m.dead_letter_reason) for m in dead(broker, queue)] == [
        ("m9", "InvalidCustomer")
    ]
    assert (stats.completed, stats.dead_lettered) == (15, 1)
    assert_balanced(broker)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll a condition the renewer thread makes true; fail after 10 s of real time."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_locks_are_renewed_while_the_handler_runs(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    send(broker, queue, 1)

    def handle(message: ReceivedMessage) -> None:
        first = message.locked_until
        clock.advance(20)  # past half the 30 s lock: due for renewal
        wait_for(lambda: message.locked_until != first, "the lock renewal")
        clock.advance(20)  # 40 s after receive: alive only because it was renewed

    stats = processor(broker, queue, handle, max_wait=0).run(until_idle=True)
    assert (stats.completed, stats.lock_lost) == (1, 0)
    assert_balanced(broker)


def test_a_lock_lost_during_the_handler_means_redelivery_not_a_crash(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    send(broker, queue, 1)
    deliveries: list[int] = []

    def handle(message: ReceivedMessage) -> None:
        deliveries.append(message.delivery_count)
        if message.delivery_count == 1:
            clock.advance(31)  # the 30 s lock runs out, renewal is off

    stats = processor(broker, queue, handle, max_wait=0, max_lock_renewal_duration=0).run(
        until_idle=True
    )
    assert deliveries == [1, 2]
    assert (stats.lock_lost, stats.completed) == (1, 1)
    assert_balanced(broker)


def test_an_on_lock_lost_hook_that_raises_is_logged_naming_hook_and_message_and_the_run_goes_on(
    broker: Broker, queue: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    send(broker, queue, 1)
    [sent] = broker.peek(queue)

    def handle(message: ReceivedMessage) -> None:
        if message.delivery_count == 1:
            clock.advance(31)  # the 30 s lock runs out, renewal is off

    def report_lost(message: ReceivedMessage) -> None:
        raise RuntimeError("the pager is down")

    stats = processor(
        broker, queue, handle, max_wait=0, max_lock_renewal_duration=0, on_lock_lost=report_lost
    ).run(until_idle=True)
    assert (stats.lock_lost, stats.completed) == (1, 1)
    [logged] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "report_lost" in logged.getMessage()
    assert f"message {sent.sequence_number} of {queue}" in logged.getMessage()
    assert logged.exc_info is not None and "the pager is down" in str(logged.exc_info[1])
    assert_balanced(broker)


def test_a_message_dead_lettered_because_its_lock_kept_running_out_counts_as_poisoned(
    broker: Broker, clock: ManualClock
) -> None:
    """A handler that outlives the lock on every delivery spends them all: the expiry of
    the last lock dead-letters the message (``MaxDeliveryCountExceeded``, counted by a
    later receive or read), and the run counts it in ``poisoned`` and gives it to
    ``on_poison`` with a ``MessageLockLostError``, as well as in ``lock_lost`` each time."""
    broker.create_queue("hangs", max_delivery_count=2, lock_duration=30)
    broker.sender("hangs").send(Message(body=b"x"))
    poisoned: list[tuple[int, type[BaseException]]] = []

    def handle(message: ReceivedMessage) -> None:
        clock.advance(31)  # the 30 s lock runs out under the handler, renewal is off

    stats = processor(
        broker, "hangs", handle, max_wait=0, max_lock_renewal_duration=0,
        on_poison=lambda m, e: poisoned.append((m.delivery_count, type(e))),
    ).run(until_idle=True)  # fmt: skip
    assert (stats.lock_lost, stats.poisoned, stats.completed) == (2, 1, 0)
    assert poisoned == [(2, poisonq.MessageLockLostError)]
    (letter,) = dead(broker, "hangs")
    assert letter.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert_balanced(broker)


def test_concurrent_pumps_complete_each_message_once(broker: Broker, queue: str) -> None:
    send(broker, queue, 300)
    seen: Counter[str] = Counter()
    guard = threading.Lock()
    threads: set[str] = set()

    def handle(message: ReceivedMessage) -> None:
        with guard:
            seen[message.message_id] += 1
            threads.add(threading.current_thread().name)

    stats = processor(broker, queue, handle, batch_size=5, concurrency=3, max_wait=0).run(
        until_idle=True
    )
    assert seen == Counter({f"m{n}": 1 for n in range(300)})
    assert stats.completed == 300
    assert threads <= {f"poisonq-processor-{n}" for n in range(3)}
    assert_balanced(broker)


@pytest.mark.parametrize("option", [{"batch_size": 0}, {"concurrency": 0}])
def test_bad_options_are_refused(broker: Broker, queue: str, option: dict[str, int]) -> None:
    with pytest.raises(poisonq.InvalidOptionError):
        processor(broker, queue, print, **option)


def _broken(message: ReceivedMessage) -> None:
    """A handler with a bug: every message fails the same way."""
    raise NameError("name 'totl' is not defined")


@pytest.mark.parametrize("batch_size", [1, 50])
def test_a_defect_stops_the_processor_without_spending_good_messages(
    broker: Broker, queue: str, batch_size: int
) -> None:
    """A bug that fails every message is not poison: the run stops with the error, and no
    message is dead-lettered (the queue allows 3 deliveries), and the failures held back
    are given back once, none reported as a lost lock."""
    send(broker, queue, 200)
    with pytest.raises(poisonq.ProcessorStoppedError) as stopped:
        processor(broker, queue, _broken, batch_size=batch_size, max_wait=0).run(until_idle=True)
    defect = stopped.value.defect
    assert defect.failure.error_type == "NameError"
    assert "totl" in defect.failure.traceback and "_broken" in defect.failure.traceback
    assert "NameError" in str(stopped.value)
    counts = broker.counts(queue)
    assert counts["dead_lettered"] == 0 and counts["completed"] == 0
    assert counts["active"] == 200
    # Failures were held, unsettled, until the defect showed: no delivery was spent.
    assert {m.delivery_count for m in broker.peek(queue, max_messages=200)} == {0}
    assert stopped.value.stats.released == (10 if batch_size == 1 else 50)
    assert stopped.value.stats.lock_lost == 0  # given back once, never reported lost
    assert_balanced(broker)


def test_a_stop_asked_before_run_is_kept_and_the_next_run_runs(broker: Broker, queue: str) -> None:
    """stop() before run() (a shutdown during start-up) makes that run return at once with
    nothing received; the run after it runs as usual."""
    send(broker, queue, 3)
    pump = processor(broker, queue, lambda message: None, max_wait=0)
    pump.stop()
    assert pump.run(until_idle=True).received == 0
    assert pump.run(until_idle=True).completed == 3
    assert_balanced(broker)


def test_stop_from_another_thread_ends_a_run_waiting_for_messages(
    broker: Broker, queue: str
) -> None:
    """stop() ends a run that waits on an idle queue within a flush interval, not after its
    ``max_wait`` (a shutdown's grace period is shorter than a long poll)."""
    pump = processor(broker, queue, lambda message: None, concurrency=2, max_wait=300)
    stopper = threading.Timer(0.2, pump.stop)
    stopper.start()
    ran = threading.Thread(target=pump.run)
    ran.start()
    ran.join(timeout=30)  # bounded: well under max_wait
    stopper.cancel()
    assert not ran.is_alive()
    assert_balanced(broker)


def test_poison_among_good_messages_does_not_stop_the_processor(broker: Broker, queue: str) -> None:
    """Below the ratio, failures are settled as usual: 20 bad in 100, same fingerprint."""
    send(broker, queue, 100)

    def handle(message: ReceivedMessage) -> None:
        if int(message.body) % 5 == 0:
            raise InvalidCustomer(f"customer of {message.message_id}")

    stats = processor(broker, queue, handle, batch_size=10, max_wait=0).run(until_idle=True)
    assert (stats.completed, stats.dead_lettered) == (80, 20)
    assert_balanced(broker)


def test_a_defect_stops_every_thread_and_the_stats_add_up(broker: Broker, queue: str) -> None:
    send(broker, queue, 300)
    with pytest.raises(poisonq.ProcessorStoppedError) as stopped:
        processor(broker, queue, _broken, batch_size=20, concurrency=3, max_wait=0).run(
            until_idle=True
        )
    stats = stopped.value.stats
    assert stats.received == stats.released + stats.abandoned + stats.lock_lost
    assert broker.counts(queue)["dead_lettered"] == 0
    assert broker.counts(queue)["active"] == 300
    assert_balanced(broker)


def test_max_failure_ratio_none_settles_a_defect_as_failures(broker: Broker, queue: str) -> None:
    send(broker, queue, 20)
    stats = processor(
        broker, queue, _broken, batch_size=20, max_wait=0, max_failure_ratio=None
    ).run(until_idle=True)
    assert stats.poisoned == 20  # three deliveries each, then the dead-letter queue
    with pytest.raises(poisonq.InvalidOptionError):
        processor(broker, queue, _broken, max_failure_ratio=1.5)


@pytest.mark.slow
def test_a_lock_lost_to_a_slow_handler_is_reported_once(url: str) -> None:
    """A handler that outlives ``max_lock_renewal_duration`` loses its lock once, and that
    loss is reported: one log line and the renewer's callback."""
    with poisonq.connect(url) as live:  # the renewer runs on the real clock
        live.create_queue("slow", lock_duration=1, max_delivery_count=5)
        live.sender("slow").send(Message(body=b"x"))
        lost: list[int] = []

        def handle(message: ReceivedMessage) -> None:
            if message.delivery_count == 1:
                time.sleep(1.8)  # past the lock, which is renewed for 0.3 s only

        stats = processor(
            live, "slow", handle, max_wait=0.5, max_lock_renewal_duration=0.3,
            on_lock_lost=lambda m: lost.append(m.delivery_count),
        ).run(until_idle=True)  # fmt: skip
        assert lost == [1]  # once, though the renewer and the settlement both saw it
        assert (stats.lock_lost, stats.completed) == (1, 1)  # delivered again, then done
        assert live.counts("slow")["completed"] == 1
        assert_balanced(live)


def test_a_handled_message_is_settled_before_the_slowest_of_its_batch(url: str) -> None:
    """Each message is settled as soon as its handler returns, not when its batch ends: a
    worker dying late in a batch of slow handlers keeps what was handled before."""
    with poisonq.connect(url) as live:
        live.create_queue("slow")
        live.sender("slow").send([Message(body=str(n)) for n in range(4)])
        seen: list[int] = []

        def handle(message: ReceivedMessage) -> None:
            seen.append(live.counts("slow")["completed"])
            time.sleep(0.3)

        Processor(live, "slow", handle, batch_size=4, max_wait=0).run(until_idle=True)
        assert seen[0] == 0 and seen[-1] >= 2  # settled while the batch went on
        assert live.counts("slow")["completed"] == 4


@pytest.mark.slow
def test_a_message_whose_lock_was_lost_while_it_waited_is_not_handled(url: str) -> None:
    """A message whose lock ran out while it waited in its batch is not handled: it comes
    again, and runs once."""
    with poisonq.connect(url) as live:
        live.create_queue("slow", lock_duration=1, max_delivery_count=5)
        live.sender("slow").send([Message(body=text) for text in ("a", "b", "c")])
        runs: list[tuple[str, int]] = []
        lost: list[str] = []

        def handle(message: ReceivedMessage) -> None:
            runs.append((message.text, message.delivery_count))
            if message.delivery_count == 1 and message.text == "a":
                time.sleep(2.5)  # the batch's locks run out meanwhile

        stats = processor(
            live, "slow", handle, batch_size=3, max_wait=0.5, max_lock_renewal_duration=0.3,
            on_lock_lost=lambda m: lost.append(m.text),
        ).run(until_idle=True)  # fmt: skip
        assert ("b", 1) not in runs and ("c", 1) not in runs
        assert sorted(lost) == ["a", "b", "c"]
        assert stats.completed == 3 and live.counts("slow")["completed"] == 3
        assert_balanced(live)


@pytest.mark.parametrize("batch_size", [1, 10])
def test_poison_at_the_end_of_a_queue_is_not_a_defect(
    broker: Broker, queue: str, batch_size: int
) -> None:
    """Poison at the end of a queue is retried at once, again and again: only first
    deliveries tell a defect, and eight in a row are too few to call one."""
    send(broker, queue, 200)

    def handle(message: ReceivedMessage) -> None:
        if int(message.body) >= 192:
            raise KeyError("no such customer")

    stats = processor(broker, queue, handle, batch_size=batch_size, max_wait=0).run(until_idle=True)
    assert (stats.completed, stats.poisoned) == (192, 8)
    assert broker.counts(queue)["dead_lettered"] == 8
    assert_balanced(broker)


def test_a_defect_that_starts_after_healthy_traffic_spends_nothing(
    broker: Broker, queue: str
) -> None:
    """A defect that starts after healthy traffic stops the Processor and spends no
    delivery, however many good messages came before it."""
    send(broker, queue, 300)

    def handle(message: ReceivedMessage) -> None:
        if int(message.body) >= 100:
            raise NameError("name 'amont' is not defined")

    with pytest.raises(poisonq.ProcessorStoppedError):
        processor(broker, queue, handle, max_wait=0).run(until_idle=True)
    counts = broker.counts(queue)
    assert (counts["completed"], counts["dead_lettered"], counts["active"]) == (100, 0, 200)
    assert {m.delivery_count for m in broker.peek(queue, max_messages=200)} == {0}
    assert_balanced(broker)


KINDS = (poisonq.Processor, poisonq.aio.Processor)


def made(kind: type[Any], url: str, handler: Any, **options: Any) -> Any:
    """A Processor of ``kind`` for queue ``orders`` on a broker of its own flavour on
    ``url`` (closed on return: the Processor is only made)."""
    if kind is poisonq.aio.Processor:

        async def make() -> Any:
            async with await poisonq.aio.connect(url) as broker:
                return poisonq.aio.Processor(broker, "orders", handler, **options)

        return asyncio.run(make())
    with poisonq.connect(url) as broker:
        return poisonq.Processor(broker, "orders", handler, **options)


@pytest.mark.parametrize("kind", KINDS, ids=["sync", "aio"])
@pytest.mark.parametrize(
    "arguments",
    [
        {"concurrency": "2"},
        {"batch_size": "50"},
        {"batch_size": 0},
        {"handler": None},
        {"max_wait": -1},
        {"max_lock_renewal_duration": "5"},
        {"max_failure_ratio": 1.5},
        {"permanent": ["ValueError"]},
        {"isolation": "thread"},
        {"batch_szie": 10},
    ],
    ids=[
        "concurrency str",
        "batch_size str",
        "batch_size 0",
        "handler None",
        "max_wait negative",
        "renewal str",
        "ratio above 1",
        "permanent names",
        "isolation thread",
        "unknown option",
    ],
)
def test_both_processors_refuse_a_wrong_argument_with_the_same_typed_error(
    sqlite_url: str, kind: Callable[..., object], arguments: dict[str, Any]
) -> None:
    """The sync and the asyncio Processor build one ProcessorOptions: an option is checked
    once, and refused by both alike, before anything is received."""
    given: dict[str, Any] = {"handler": lambda message: None, **arguments}
    handler = given.pop("handler")
    with pytest.raises(poisonq.InvalidOptionError):
        made(kind, sqlite_url, handler, **given)


def test_max_lock_renewal_duration_takes_every_duration_a_queue_option_takes(
    sqlite_url: str,
) -> None:
    """Both Processors and both lock renewers read ``max_lock_renewal_duration`` as a queue
    option's duration: seconds, a timedelta or ISO 8601 text; bad text is refused alike."""
    for given in (300, timedelta(minutes=5), "PT5M"):
        for kind in KINDS:
            processor = made(kind, sqlite_url, print, max_lock_renewal_duration=given)
            assert processor.options.max_lock_renewal_duration == 300.0
        renewer = poisonq.AutoLockRenewer(given, thread=False)
        assert renewer.max_lock_renewal_duration == 300.0
        assert poisonq.aio.AutoLockRenewer(given).sync.max_lock_renewal_duration == 300.0
    for kind in KINDS:
        with pytest.raises(poisonq.InvalidOptionError, match="max_lock_renewal_duration"):
            made(kind, sqlite_url, print, max_lock_renewal_duration="5 minutes")
        with pytest.raises(poisonq.InvalidOptionError, match="max_lock_renewal_duration"):
            poisonq.AutoLockRenewer("PT5", thread=False)


@pytest.mark.parametrize("value", ["no", "false", "yes", 1, 0, None])
def test_a_boolean_option_that_is_not_a_bool_is_refused_naming_it(
    sqlite_url: str, value: object
) -> None:
    """A boolean option is a bool: anything else (``"no"`` is truthy) is refused by both
    Processors, naming the option."""
    for kind in KINDS:
        with pytest.raises(poisonq.InvalidOptionError, match="batch"):
            made(kind, sqlite_url, print, batch=value)


@pytest.mark.parametrize("value", ["false", "no", 1])
def test_run_until_idle_that_is_not_a_bool_is_refused_before_receiving(
    sqlite_url: str, value: object
) -> None:
    """``until_idle`` is a bool: anything else is refused by both Processors' ``run``, naming
    it, before a message is received."""

    async def run_async() -> None:
        async with await poisonq.aio.connect(sqlite_url) as abroker:
            runner = poisonq.aio.Processor(abroker, "orders", print, max_wait=0)
            await runner.run(until_idle=value)  # type: ignore[arg-type]

    with poisonq.connect(sqlite_url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=b"x")])
        runner = Processor(broker, "orders", print, max_wait=0)
        with pytest.raises(poisonq.InvalidOptionError, match="until_idle"):
            runner.run(until_idle=value)  # type: ignore[arg-type]
        with pytest.raises(poisonq.InvalidOptionError, match="until_idle"):
            asyncio.run(run_async())
        assert broker.counts("orders")["active"] == 1


@pytest.mark.parametrize("hook", ["on_poison", "on_lock_lost"])
@pytest.mark.parametrize("value", [5, "x"])
def test_a_hook_that_is_not_callable_is_refused_at_construction(
    sqlite_url: str, hook: str, value: object
) -> None:
    """A hook is None or callable, checked as either Processor is made (not at the first
    poisoned message, where calling it would end the run)."""
    for kind in KINDS:
        with pytest.raises(poisonq.InvalidOptionError, match=hook):
            made(kind, sqlite_url, print, **{hook: value})


def test_a_single_permanent_exception_type_is_taken_as_if_listed(sqlite_url: str) -> None:
    """One exception type means that type: both Processors take ``permanent=ValueError`` as
    ``(ValueError,)``."""
    for kind in KINDS:
        processor = made(kind, sqlite_url, print, permanent=ValueError)
        assert processor.options.permanent == (ValueError,)
        assert ValueError in processor.options.permanent_errors


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"permanent": "ValueError"}, "'ValueError'"),
        ({"permanent": 5}, "5"),
        ({"permanent": [ValueError, "KeyError"]}, "'KeyError'"),
        ({"max_failure_ratio": "0.5"}, "'0.5'"),
        ({"max_failure_ratio": True}, "True"),
    ],
)
def test_a_wrong_permanent_or_ratio_is_a_typed_error_naming_option_and_value(
    sqlite_url: str, arguments: dict[str, Any], named: str
) -> None:
    """A wrong ``permanent`` or ``max_failure_ratio`` is an InvalidOptionError naming the
    option and the value given (the whole value, not its first character), from both
    Processors."""
    (option,) = arguments
    for kind in KINDS:
        with pytest.raises(poisonq.InvalidOptionError) as refused:
            made(kind, sqlite_url, print, **arguments)
        assert option in str(refused.value) and named in str(refused.value)


def test_a_wrong_auto_lock_renewer_is_refused_before_anything_is_locked(
    broker: Broker, queue: str
) -> None:
    """A renewer that is not an AutoLockRenewer would fail after the receive, its messages
    left locked to count a delivery: it is refused first, by every receiver."""
    broker.create_queue("carts", requires_session=True)
    send(broker, queue, 1)
    broker.sender("carts").send(Message(body="x", session_id="a"))
    with pytest.raises(poisonq.InvalidOptionError, match="auto_lock_renewer"):
        broker.receiver(queue, auto_lock_renewer="oops")  # type: ignore[arg-type]
    with pytest.raises(poisonq.InvalidOptionError, match="auto_lock_renewer"):
        broker.accept_session("carts", "a", auto_lock_renewer="oops")  # type: ignore[arg-type]
    with pytest.raises(poisonq.InvalidOptionError, match="auto_lock_renewer"):
        broker.accept_next_session("carts", max_wait=0, auto_lock_renewer="x")  # type: ignore[arg-type]
    assert broker.counts(queue)["locked"] == 0 and broker.counts("carts")["locked"] == 0
    assert broker.accept_session("carts", "a").session_id == "a"  # nobody holds it


@pytest.mark.parametrize("batch", [False, True], ids=["message handler", "batch handler"])
def test_an_interrupted_run_counts_no_delivery_for_what_it_did_not_finish(
    broker: Broker, queue: str, batch: bool
) -> None:
    """Ctrl-C (KeyboardInterrupt) is not a failed delivery: what the handler finished is
    settled, the rest of the batch (the message in hand too) goes back at once with its
    delivery count as it was, none of it left locked to run out and come back a suspect."""
    send(broker, queue, 10)
    seen: list[int] = []

    def handle(work: ReceivedMessage | list[ReceivedMessage]) -> None:
        if isinstance(work, list) or len(seen) == 4:
            raise KeyboardInterrupt
        seen.append(work.sequence_number)

    with pytest.raises(KeyboardInterrupt):
        processor(broker, queue, handle, batch_size=10, batch=batch, max_wait=0).run()
    counts = broker.counts(queue)
    finished = 0 if batch else 4
    assert (counts["completed"], counts["active"], counts["locked"]) == (finished, 10 - finished, 0)
    assert {m.delivery_count for m in broker.peek(queue, max_messages=10)} == {0}
    assert_balanced(broker)


def test_a_lock_renew_failure_callback_that_raises_is_logged_and_the_pass_goes_on(
    url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewer's pass reports every lost lock, though a callback raises for the first;
    each error is logged naming the callback."""
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders", lock_duration=30)
        send(broker, "orders", 2)
        reported: list[int] = []

        def on_failure(message: ReceivedMessage, error: BaseException) -> None:
            reported.append(message.sequence_number)
            raise RuntimeError("the pager is down")

        renewer = poisonq.AutoLockRenewer(0, on_failure, thread=False)
        receiver = broker.receiver("orders")
        held = receiver.receive(max_messages=2)
        renewer.register(receiver, held)
        clock.advance(31)  # both locks run out; renewing stopped at once (0 s)
        renewer.renew_due()
        assert sorted(reported) == sorted(m.sequence_number for m in held)
        logged = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(logged) == 2 and all("on_failure" in r.getMessage() for r in logged)
        renewer.close()
