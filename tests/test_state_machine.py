"""A hypothesis state machine over one queue on a real store, checked against a model: a SQLite
file, and (with fewer examples, each in a fresh schema) a PostgreSQL database.

The model is a dictionary of every message the test sent, with the state and counters the
contract (docs/design.md, "The message state machine") says it must have. Time is the store's
clock: what is due (expired locks and the poison decision they trigger, retry cycles that end,
due scheduled messages, expired TTLs) is applied when it is due as every reader sees it, a
receive or a read (``counts``, ``peek``, ``audit``) alike, whoever makes it. So the model
applies everything due before it compares itself with what the broker shows, and before each
receive; a lock past its time is never seen as held, an expired message never as ``active``.
A deferred message never expires (Service Bus): ``receive_deferred`` delivers it past its TTL.

The queue's retry policy is drawn too: immediate retries, retry cycles through the retry
subqueue (``orders;retry``) with a growing delay, and each poison action: ``move`` (the
dead-letter queue), ``drop``, ``reject`` (no message has a ``reply_to``, so the namespace
dead-letter queue) and ``fault`` (the queue refuses receives until an operator resolves the
message by its sequence number).

One path of ``receive_deferred`` is left to its own tests at the end of this file rather than
modelled: a deferred message that already used every delivery (poisoned instead of
delivered).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import poisonq
from poisonq import (
    Broker,
    DeadLetterReason,
    Lease,
    ManualClock,
    Message,
    MessageLockLostError,
    MessageNotFoundError,
    MessageState,
    PoisonMessageError,
    ReceivedMessage,
    Receiver,
    RetryPolicy,
)
from tests import aio_driver
from tests.helpers import assert_balanced

if TYPE_CHECKING:
    from poisonq.testing.pgserver import TemporaryServer

Q = "orders"
DLQ = "orders/$deadletterqueue"
QUEUE_LOCK = 30.0
RETRY_Q = "orders;retry"
NAMESPACE_DLQ = "$deadletterqueue"
MAIN, DEAD, GONE, RETRY, REJECTED = "main", "dlq", "gone", "retry", "rejected"


@dataclass
class Model:
    """What the contract says one message looks like now."""

    seq: int
    message_id: str
    where: str  # MAIN, DEAD, RETRY, REJECTED (namespace DLQ) or GONE (completed, dropped)
    state: MessageState
    delivery_count: int = 0
    abort_count: int = 0
    move_count: int = 0
    resubmit_count: int = 0
    expires_at: float | None = None
    visible_at: float | None = None
    lock_token: str | None = None
    locked_until: float | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Handle:
    """A message as a receiver got it, with the lock it was given then."""

    entity: str  # MAIN or DEAD
    message: ReceivedMessage

    @property
    def seq(self) -> int:
        return self.message.sequence_number


lock_durations = st.sampled_from([None, 5.0, 45.0])
# Durations are whole seconds from small sets as well as ranges, so that a clock step often
# lands exactly on a lock's or a TTL's end: the boundary (expired at ``now == end``) matters.
seconds = st.sampled_from([5, 10, 30, 45, 60]) | st.integers(1, 150)


class QueueMachine(RuleBasedStateMachine):
    LEASES = True  # whether the machine takes leases, as a pipeline does

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="poisonq-sm-"))
        self.clock = ManualClock()
        self.opened = contextlib.ExitStack()
        self.broker: Broker = self.opened.enter_context(self.connect())
        self.ready = False
        self.msgs: dict[int, Model] = {}
        self.handles: list[Handle] = []
        self.sent = 0
        self.next_id = 0
        self.max_seq = 0
        self.completed = {MAIN: 0, DEAD: 0}
        self.dropped = 0
        self.faulted: list[int] = []  # the poison messages the queue faulted on, in turn
        self.leases: list[Lease] = []  # the leases taken, as a pipeline takes them
        # Every delivery since the last invariant check: (delivery_count, expires_at, now).
        self.deliveries: list[tuple[int, float | None, float]] = []

    def store_url(self) -> str:
        # synchronous=normal: a real file in WAL mode, without an fsync per commit (durability
        # across a power cut is not what this test is about, and shrinking runs it many times).
        return f"sqlite:///{self.dir / 'q.db'}?synchronous=normal"

    def connect(self) -> contextlib.AbstractContextManager[Broker]:
        return poisonq.connect(self.store_url(), clock=self.clock)

    def teardown(self) -> None:
        self.opened.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # Configuration ------------------------------------------------------------------------
    @initialize(
        max_delivery_count=st.integers(1, 4),
        default_ttl=st.none() | st.sampled_from([30, 60]) | st.integers(20, 200),
        handling=st.sampled_from(["move", "drop", "reject", "fault"]),
        cycles=st.sampled_from([0, 0, 1, 2]),
        cycle_delay=st.sampled_from([10, 30]),
        growth=st.sampled_from([1, 2]),
        expiry_dead_letters=st.booleans(),
    )
    def create(
        self,
        max_delivery_count: int,
        default_ttl: int | None,
        handling: str,
        cycles: int,
        cycle_delay: int,
        growth: int,
        expiry_dead_letters: bool,
    ) -> None:
        self.per_cycle = max_delivery_count
        self.max_dc = max_delivery_count * (cycles + 1)  # total attempts
        self.cycles, self.cycle_delay, self.growth = cycles, cycle_delay, growth
        self.default_ttl = default_ttl
        self.handling = handling
        self.expiry_dead_letters = expiry_dead_letters
        retry = RetryPolicy(
            receive_retry_count=max_delivery_count - 1,
            max_retry_cycles=cycles,
            retry_cycle_delay=cycle_delay,
            retry_cycle_delay_multiplier=growth,
            receive_error_handling=handling,  # type: ignore[arg-type]
        )
        self.broker.create_queue(
            Q,
            retry=retry,
            lock_duration=QUEUE_LOCK,
            default_message_ttl=default_ttl,
            dead_lettering_on_message_expiration=expiry_dead_letters,
        )
        self.ready = True

    # Model helpers ------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now()

    def _in(self, where: str, *states: MessageState) -> list[Model]:
        return sorted(
            (m for m in self.msgs.values() if m.where == where and m.state in states),
            key=lambda m: m.seq,
        )

    def _expired_locks(self, where: str) -> list[Model]:
        return [
            m
            for m in self._in(where, MessageState.LOCKED)
            if m.locked_until is not None and m.locked_until <= self.now
        ]

    def _valid(self, handle: Handle) -> bool:
        m = self.msgs.get(handle.seq)
        return (
            m is not None
            and m.where == handle.entity
            and m.state is MessageState.LOCKED
            and m.lock_token == handle.message.lock_token
            and m.locked_until is not None
            and m.locked_until > self.now
        )

    def _valid_handles(self, entity: str) -> list[Handle]:
        return [h for h in self.handles if h.entity == entity and self._valid(h)]

    def _stale_handles(self) -> list[Handle]:
        return [h for h in self.handles if not self._valid(h)]

    def _to_dead_letter(self, m: Model, reason: str) -> None:
        m.where, m.state, m.reason = DEAD, MessageState.DEAD_LETTERED, reason
        m.lock_token = m.locked_until = None

    def _drop(self, m: Model) -> None:
        m.where, m.state = GONE, MessageState.DROPPED
        self.dropped += 1

    def _complete(self, m: Model) -> None:
        self.completed[m.where] += 1
        m.where, m.state = GONE, MessageState.COMPLETED

    def _release(self, m: Model) -> bool:
        """An abandon or a lock expiry; returns whether the message was poisoned."""
        m.abort_count += 1
        m.lock_token = m.locked_until = None
        if m.where == DEAD:
            m.state = MessageState.DEAD_LETTERED  # a dead-letter queue never poisons
            return False
        m.state = MessageState.ACTIVE
        if m.delivery_count < self.per_cycle * (m.move_count + 1):
            return False
        if m.move_count < self.cycles and m.delivery_count < self.max_dc:
            m.visible_at = self.now + self.cycle_delay * self.growth**m.move_count
            m.where, m.state = RETRY, MessageState.SCHEDULED
            m.move_count += 1
            return False
        match self.handling:
            case "drop":
                self._drop(m)
            case "move":
                self._to_dead_letter(m, DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED)
            case "reject":
                self._to_dead_letter(m, DeadLetterReason.REJECTED)
                m.where = REJECTED
            case "fault":
                if m.seq not in self.faulted:
                    self.faulted.append(m.seq)  # the message stays, active
        return True

    def _housekeep(self, where: str) -> bool:
        """What is due of ``where`` by now, applied in the engine's order (by a receive, or
        before any read); returns whether the queue can still be received from (a lock
        expiry may fault it). Everything due is applied, whatever the queue's status."""
        now = self.now
        faulted_before = bool(self.faulted)
        for m in self._in(where, MessageState.LOCKED):
            assert m.locked_until is not None
            if m.locked_until <= now:
                self._release(m)
        if where == DEAD:
            return True  # no TTL and no scheduling in a dead-letter queue
        for m in self._in(RETRY, MessageState.SCHEDULED):
            assert m.visible_at is not None
            if m.visible_at <= now:
                m.where, m.state = MAIN, MessageState.ACTIVE
        for m in self._in(MAIN, MessageState.SCHEDULED):
            assert m.visible_at is not None
            if m.visible_at <= now:
                m.state = MessageState.ACTIVE
        for m in self._in(MAIN, MessageState.SCHEDULED, MessageState.ACTIVE):
            if m.expires_at is not None and m.expires_at <= now:
                if self.expiry_dead_letters:
                    self._to_dead_letter(m, DeadLetterReason.TTL_EXPIRED)
                else:
                    self._drop(m)
        return not self.faulted or faulted_before

    def _as_read(self) -> None:
        """What a reader of the queue and its dead-letter queue finds: everything due by
        now applied (the broker's reads apply it too, before they read)."""
        self._housekeep(MAIN)
        self._housekeep(DEAD)

    def _delivered(
        self,
        entity: str,
        got: list[ReceivedMessage],
        expected: list[Model],
        lock: float | None,
        deferred: bool = False,
    ) -> None:
        """Check what a peek-lock receive returned against the model, and record the locks."""
        assert [g.sequence_number for g in got] == [m.seq for m in expected]
        tokens = {g.lock_token for g in got}
        assert len(tokens) <= 1 and None not in tokens  # one new token per receive call
        assert not tokens & {h.message.lock_token for h in self.handles}
        for g, m in zip(got, expected, strict=True):
            m.delivery_count += 1
            assert g.state is MessageState.LOCKED
            assert (g.delivery_count, g.abort_count) == (m.delivery_count, m.abort_count)
            assert g.message_id == m.message_id
            assert g.locked_until is not None
            assert g.locked_until.timestamp() == self.now + (lock or QUEUE_LOCK)
            m.state, m.lock_token = MessageState.LOCKED, g.lock_token
            m.locked_until = g.locked_until.timestamp()
            self.handles.append(Handle(entity, g))
            if entity == MAIN:
                self._record_delivery(g, deferred)
        self.handles = self.handles[-60:]

    def _record_delivery(self, g: ReceivedMessage, deferred: bool = False) -> None:
        """A delivery to check against the limits; a deferred message's TTL does not limit
        it (it never expires)."""
        expires = None if g.expires_at is None or deferred else g.expires_at.timestamp()
        self.deliveries.append((g.delivery_count, expires, self.now))

    def _receiver(self, entity: str, lock: float | None = None) -> Receiver:
        subqueue = "deadletter" if entity == DEAD else None
        return self.broker.receiver(Q, subqueue=subqueue, lock_duration=lock)

    # Sending ------------------------------------------------------------------------------
    @rule(
        batch=st.lists(
            st.tuples(
                st.none() | seconds,  # time_to_live
                st.none() | st.sampled_from([-10, 0]) | seconds,  # scheduled, from now
            ),
            min_size=1,
            max_size=5,
        )
    )
    def send(self, batch: list[tuple[int | None, int | None]]) -> None:
        now = self.now
        messages, models = [], []
        for ttl, delay in batch:
            self.next_id += 1
            mid = f"m-{self.next_id}"
            at = None if delay is None else datetime.fromtimestamp(now + delay, UTC)
            messages.append(
                Message(
                    body=mid.encode(), message_id=mid, time_to_live=ttl, scheduled_enqueue_time=at
                )
            )
            scheduled = delay is not None and delay > 0
            life = self.default_ttl if ttl is None else min(ttl, self.default_ttl or ttl)
            start = max(now, now + delay) if delay is not None else now
            models.append(
                Model(
                    seq=0,
                    message_id=mid,
                    where=MAIN,
                    state=MessageState.SCHEDULED if scheduled else MessageState.ACTIVE,
                    expires_at=None if life is None else start + life,
                    visible_at=now + delay if scheduled and delay is not None else None,
                )
            )
        seqs = self.broker.sender(Q).send(messages)
        assert len(seqs) == len(models)
        assert seqs == sorted(seqs) and seqs[0] > self.max_seq  # monotonic
        for seq, m in zip(seqs, models, strict=True):
            m.seq = seq
            self.msgs[seq] = m
        self.max_seq = seqs[-1]
        self.sent += len(seqs)

    # Receiving ----------------------------------------------------------------------------
    @rule(n=st.integers(1, 5), lock=lock_durations, wait=st.just(0) | seconds)
    def receive(self, n: int, lock: float | None, wait: int) -> None:
        """Peek-lock receive, ``wait`` seconds after the previous step (so that locks taken
        earlier expire, and the same messages come back, more often than by chance)."""
        self.clock.advance(wait)
        if self._refused_as_faulted(self._receiver(MAIN, lock)):
            return
        expected = self._in(MAIN, MessageState.ACTIVE)[:n] if self._housekeep(MAIN) else []
        got = self._receiver(MAIN, lock).receive(max_messages=n)
        self._delivered(MAIN, got, expected, lock)

    def _refused_as_faulted(self, receiver: Receiver) -> bool:
        """A faulted queue refuses receives with the poison message's sequence number."""
        if not self.faulted:
            return False
        with pytest.raises(PoisonMessageError) as caught:
            receiver.receive()
        assert caught.value.sequence_number == self.faulted[0]
        return True

    @precondition(lambda self: self.ready and bool(self.faulted))
    @rule(action=st.sampled_from(["move", "drop", "resubmit"]))
    def resolve_fault(self, action: str) -> None:
        """The operator acts on the poison message by sequence number; the queue is enabled
        once no other poison message of the fault waits. A message that left meanwhile is
        refused as unknown and the operator goes on to the next (or only enables it)."""

        def waiting(seq: int) -> bool:
            m = self.msgs.get(seq)
            return m is not None and m.where == MAIN and m.state is MessageState.ACTIVE

        while self.faulted:
            seq = self.faulted.pop(0)
            if not waiting(seq):
                with pytest.raises(MessageNotFoundError):
                    self.broker.resolve_poison(Q, seq, action)
                continue
            m = self.msgs[seq]
            info = self.broker.resolve_poison(Q, seq, action)
            self.faulted = [s for s in self.faulted if waiting(s)]
            assert info.status == ("receive_disabled" if self.faulted else "active")
            break
        else:
            self.broker.enable(Q)
            return
        match action:
            case "move":
                self._to_dead_letter(m, DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED)
            case "drop":
                self._drop(m)
            case "resubmit":
                [copy] = self.broker.peek(Q, from_sequence=self.max_seq + 1, max_messages=1)
                del self.msgs[seq]
                expires = None if self.default_ttl is None else self.now + self.default_ttl
                self.msgs[copy.sequence_number] = Model(
                    seq=copy.sequence_number,
                    message_id=m.message_id,
                    where=MAIN,
                    state=MessageState.ACTIVE,
                    abort_count=m.abort_count,
                    resubmit_count=m.resubmit_count + 1,
                    expires_at=expires,
                )
                self.max_seq = copy.sequence_number

    @rule(n=st.integers(1, 5))
    def receive_and_delete(self, n: int) -> None:
        receiver = self.broker.receiver(Q, receive_mode="receive_and_delete")
        if self._refused_as_faulted(receiver):
            return
        expected = self._in(MAIN, MessageState.ACTIVE)[:n] if self._housekeep(MAIN) else []
        got = receiver.receive(max_messages=n)
        assert [g.sequence_number for g in got] == [m.seq for m in expected]
        for g, m in zip(got, expected, strict=True):
            m.delivery_count += 1
            assert g.state is MessageState.COMPLETED
            assert g.delivery_count == m.delivery_count
            self._record_delivery(g)
            self._complete(m)

    def _deferred_receivable(self) -> list[Model]:
        # Spent deferred messages have their own tests (see the module docstring); those past
        # their TTL are here: they never expire.
        return [m for m in self._in(MAIN, MessageState.DEFERRED) if m.delivery_count < self.max_dc]

    @precondition(lambda self: self.ready and self._deferred_receivable())
    @rule(data=st.data(), lock=lock_durations, missing=st.none() | st.integers(-3, 3))
    def receive_deferred(
        self, data: st.DataObject, lock: float | None, missing: int | None
    ) -> None:
        """Lock deferred messages by sequence number; with one number that names no deferred
        message, :class:`MessageNotFoundError` is raised and nothing is locked."""
        candidates = self._deferred_receivable()
        seqs = data.draw(st.lists(st.sampled_from([m.seq for m in candidates]), min_size=1))
        chosen = [self.msgs[seq] for seq in sorted(set(seqs))]
        receiver = self._receiver(MAIN, lock)
        if missing is not None:
            wrong = self.max_seq + missing  # a message in another state, gone, or never sent
            other = self.msgs.get(wrong)
            if other is None or other.where != MAIN or other.state is not MessageState.DEFERRED:
                with pytest.raises(MessageNotFoundError) as caught:
                    receiver.receive_deferred([m.seq for m in chosen] + [wrong])
                assert caught.value.sequence_number == wrong
                return  # nothing changed: the invariants compare the model with the broker
        self._housekeep(MAIN)  # receive_deferred housekeeps too, in its transaction
        got = receiver.receive_deferred([m.seq for m in chosen])
        self._delivered(MAIN, got, chosen, lock, deferred=True)

    # Settling on the queue ----------------------------------------------------------------
    @precondition(lambda self: self.ready and self._valid_handles(MAIN))
    @rule(
        data=st.data(),
        action=st.sampled_from(["complete", "abandon", "defer", "dead_letter", "renew"]),
        lock=lock_durations,
    )
    def settle(self, data: st.DataObject, action: str, lock: float | None) -> None:
        handle = data.draw(st.sampled_from(self._valid_handles(MAIN)))
        m = self.msgs[handle.seq]
        receiver = self._receiver(MAIN, lock)
        match action:
            case "complete":
                receiver.complete(handle.message)
                self._complete(m)
            case "abandon":
                poisoned = receiver.abandon(handle.message, error=ValueError("try again"))
                assert poisoned == ([m.seq] if self._release(m) else [])
            case "defer":
                receiver.defer(handle.message)
                m.state, m.lock_token, m.locked_until = MessageState.DEFERRED, None, None
            case "dead_letter":
                reason = data.draw(st.sampled_from([None, "", "BadInput"]))
                receiver.dead_letter(handle.message, reason=reason, description="checked")
                self._to_dead_letter(m, reason or "DeadLetteredByReceiver")
            case "renew":
                receiver.renew_lock(handle.message)
                m.locked_until = self.now + (lock or QUEUE_LOCK)
                assert handle.message.locked_until is not None
                assert handle.message.locked_until.timestamp() == m.locked_until

    @precondition(lambda self: self.ready and self._stale_handles())
    @rule(
        data=st.data(),
        action=st.sampled_from(["complete", "abandon", "defer", "dead_letter", "renew"]),
        with_valid=st.booleans(),
    )
    def settle_with_a_lost_lock(self, data: st.DataObject, action: str, with_valid: bool) -> None:
        """A stale lock (expired, superseded or settled) raises and changes nothing, even
        when settled in one batch with a lock that is still valid."""
        stale = data.draw(st.sampled_from(self._stale_handles()))
        batch = [stale.message]
        valid = self._valid_handles(stale.entity)
        if with_valid and valid:
            batch.insert(0, data.draw(st.sampled_from(valid)).message)
        if stale.entity == DEAD and action in ("defer", "dead_letter"):
            action = "complete"  # a dead-letter queue refuses dead_letter before any lock check
        receiver = self._receiver(stale.entity)
        settle = {
            "complete": receiver.complete,
            "abandon": receiver.abandon,
            "defer": receiver.defer,
            "dead_letter": receiver.dead_letter,
            "renew": receiver.renew_lock,
        }[action]
        # renew_lock updates locked_until on the objects it is given: give it copies.
        copies = [replace(message) for message in batch]
        with pytest.raises(MessageLockLostError) as caught:
            settle(copies)
        assert stale.seq in caught.value.sequence_numbers
        # The model is unchanged; the invariants compare it with the broker.

    # Leases: a pipeline's batches --------------------------------------------------------
    def _lease_held(
        self,
        lease: Lease,
        lo: int | None = None,
        hi: int | None = None,
        *,
        ran_out: bool = False,
    ) -> list[Model]:
        """The lease's messages in ``[lo, hi]`` under a valid lock; with ``ran_out``, also
        those whose lock ran out and that nothing reclaimed since (a replay revives them)."""
        lo = lease.min_sequence if lo is None else lo
        hi = lease.max_sequence if hi is None else hi
        return [
            m
            for m in self._in(MAIN, MessageState.LOCKED)
            if m.lock_token == lease.lock_token
            and m.locked_until is not None
            and (ran_out or m.locked_until > self.now)
            and lo <= m.seq <= hi
        ]

    @precondition(lambda self: self.LEASES)
    @rule(n=st.integers(1, 8), lock=lock_durations, wait=st.just(0) | seconds)
    def lease(self, n: int, lock: float | None, wait: int) -> None:
        """Lease the next batch, as a pipeline does: the oldest ready messages, locked under
        one token (a store may lock its fresh part as one range)."""
        self.clock.advance(wait)
        number = len(self.leases) + 1
        if self.faulted:
            with pytest.raises(PoisonMessageError):
                self.broker.acquire_lease(Q, "pipeline", number, n, lock)
            return
        expected = self._in(MAIN, MessageState.ACTIVE)[:n] if self._housekeep(MAIN) else []
        lease = self.broker.acquire_lease(Q, "pipeline", number, n, lock)
        if not expected:
            assert lease is None
            return
        assert lease is not None
        assert (lease.number, lease.count) == (number, len(expected))
        assert (lease.min_sequence, lease.max_sequence) == (expected[0].seq, expected[-1].seq)
        self.leases.append(lease)
        # A peek shows no lock token: the pipeline's handles carry its lease's.
        token = lease.lock_token
        got = [replace(self.broker.message(Q, m.seq), lock_token=token) for m in expected]
        self._delivered(MAIN, got, expected, lock)
        assert self.broker.lease_sequence_numbers(lease) == [m.seq for m in expected]
        rows = self.broker.lease_rows(lease)
        assert [(r[0], r[-1]) for r in rows] == [(m.seq, m.delivery_count) for m in expected]

    @precondition(lambda self: self.ready and bool(self.leases))
    @rule(data=st.data(), lock=lock_durations, replay=st.booleans())
    def renew_lease(self, data: st.DataObject, lock: float | None, replay: bool) -> None:
        """Renew what a lease still holds, or (``replay``) ask for the lease again, as a
        restarted pipeline does: the same lease, renewed, its locks that ran out revived if
        nothing reclaimed them."""
        if replay:  # a consumer keeps its last two leases (it replays no older one)
            lease = data.draw(st.sampled_from(self.leases[-2:]))
        else:
            lease = data.draw(st.sampled_from(self.leases))
        held = self._lease_held(lease, ran_out=replay)
        if replay:
            again = self.broker.acquire_lease(Q, "pipeline", lease.number, 1, lock)
            assert again is not None and again.lock_token == lease.lock_token
        else:
            assert self.broker.renew_lease(lease, lock) == len(held)
        for m in held:
            m.locked_until = self.now + (lock or QUEUE_LOCK)

    @precondition(lambda self: self.ready and bool(self.leases))
    @rule(data=st.data())
    def complete_lease(self, data: st.DataObject) -> None:
        """Complete a lease: what it still holds is completed, what was settled apart or
        whose lock ran out is not."""
        lease = data.draw(st.sampled_from(self.leases))
        held = self._lease_held(lease)
        assert self.broker.complete_lease(lease) == len(held)
        for m in held:
            self._complete(m)

    @precondition(lambda self: self.ready and bool(self.leases))
    @rule(data=st.data(), whole=st.booleans())
    def release_lease(self, data: st.DataObject, whole: bool) -> None:
        """Give back a lease, or a span of it, as if never delivered."""
        lease = data.draw(st.sampled_from(self.leases))
        lo = hi = None
        if not whole:
            span = st.integers(lease.min_sequence, lease.max_sequence)
            lo, hi = sorted((data.draw(span), data.draw(span)))
        held = self._lease_held(lease, lo, hi)
        assert self.broker.release_lease(lease, lo, hi) == len(held)
        for m in held:
            m.state, m.lock_token, m.locked_until = MessageState.ACTIVE, None, None
            m.delivery_count -= 1

    # The dead-letter queue ----------------------------------------------------------------
    @rule(n=st.integers(1, 5), lock=lock_durations)
    def receive_dead_letters(self, n: int, lock: float | None) -> None:
        self._housekeep(DEAD)
        expected = self._in(DEAD, MessageState.DEAD_LETTERED)[:n]
        got = self._receiver(DEAD, lock).receive(max_messages=n)
        self._delivered(DEAD, got, expected, lock)
        for g, m in zip(got, expected, strict=True):
            assert g.dead_letter_reason == m.reason

    @precondition(lambda self: self.ready and self._valid_handles(DEAD))
    @rule(data=st.data(), action=st.sampled_from(["complete", "abandon", "renew"]))
    def settle_dead_letter(self, data: st.DataObject, action: str) -> None:
        handle = data.draw(st.sampled_from(self._valid_handles(DEAD)))
        m = self.msgs[handle.seq]
        receiver = self._receiver(DEAD)
        match action:
            case "complete":
                receiver.complete(handle.message)
                self._complete(m)
            case "abandon":
                assert receiver.abandon(handle.message) == []
                assert not self._release(m)
            case "renew":
                receiver.renew_lock(handle.message)
                m.locked_until = self.now + QUEUE_LOCK

    @precondition(lambda self: self.ready and self._in(DEAD, MessageState.DEAD_LETTERED))
    @rule()
    def resubmit(self) -> None:
        """Every dead-lettered message not locked goes back to the queue, in order, as a new
        message (a new sequence number) with a fresh delivery count and TTL. A task counts
        the dead-letter queue's expired locks first."""
        self._housekeep(DEAD)
        moving = self._in(DEAD, MessageState.DEAD_LETTERED)
        task = self.broker.resubmit(Q, rate=None)
        assert (task.status, task.done) == ("completed", len(moving))
        back = self.broker.peek(Q, from_sequence=self.max_seq + 1, max_messages=100)
        assert [b.message_id for b in back] == [m.message_id for m in moving]
        for b, old in zip(back, moving, strict=True):
            del self.msgs[old.seq]
            expires = None if self.default_ttl is None else self.now + self.default_ttl
            self.msgs[b.sequence_number] = Model(
                seq=b.sequence_number,
                message_id=old.message_id,
                where=MAIN,
                state=MessageState.ACTIVE,
                abort_count=old.abort_count,
                resubmit_count=old.resubmit_count + 1,
                expires_at=expires,
            )
            assert b.dead_letter_reason is None and b.dead_letter_source is None
        if back:
            self.max_seq = back[-1].sequence_number

    # Time ---------------------------------------------------------------------------------
    @rule(by=st.just(0) | seconds)
    def advance(self, by: int) -> None:
        self.clock.advance(by)

    # Invariants ---------------------------------------------------------------------------
    @invariant()
    def deliveries_respect_the_limits(self) -> None:
        """No delivery beyond max_delivery_count, none at or after the message's TTL."""
        for count, expires, at in self.deliveries:
            assert 1 <= count <= self.max_dc
            assert expires is None or at < expires
        self.deliveries.clear()

    @invariant()
    def broker_matches_the_model(self) -> None:
        if not self.ready:
            return
        self._as_read()
        counts = self.broker.counts(Q)
        model = {
            state.value: len(self._in(MAIN, state))
            for state in (
                MessageState.SCHEDULED,
                MessageState.ACTIVE,
                MessageState.LOCKED,
                MessageState.DEFERRED,
            )
        }
        model["dead_lettered"] = len([m for m in self.msgs.values() if m.where == DEAD])
        model["completed"] = self.completed[MAIN]
        model["dropped"] = self.dropped
        assert counts == model
        dlq = self.broker.counts(DLQ)
        assert dlq["completed"] == self.completed[DEAD]
        locked = self._in(DEAD, MessageState.LOCKED)
        assert dlq["locked"] == len(locked)
        assert not self._expired_locks(MAIN) and not self._expired_locks(DEAD)

        def view(m: Model | ReceivedMessage) -> tuple[object, ...]:
            if isinstance(m, Model):
                return (
                    m.seq, m.message_id, m.state, m.delivery_count, m.abort_count,
                    m.move_count, m.reason,
                )  # fmt: skip
            reason = m.dead_letter_reason
            return (
                m.sequence_number,
                m.message_id,
                m.state,
                m.delivery_count,
                m.abort_count,
                m.move_count,
                reason,
            )

        for entity, address in (
            (MAIN, Q),
            (DEAD, DLQ),
            (RETRY, RETRY_Q),
            (REJECTED, NAMESPACE_DLQ),
        ):
            if entity == REJECTED and not any(m.where == REJECTED for m in self.msgs.values()):
                continue  # the namespace dead-letter queue exists once something is rejected
            peeked = self.broker.peek(address, max_messages=10_000)
            held = sorted((m for m in self.msgs.values() if m.where == entity), key=lambda m: m.seq)
            assert [view(p) for p in peeked] == [view(m) for m in held]
            for p, m in zip(peeked, held, strict=True):
                assert p.resubmit_count == m.resubmit_count
                expires = None if p.expires_at is None else p.expires_at.timestamp()
                assert expires == m.expires_at
                if entity == MAIN:
                    assert p.delivery_count <= self.max_dc

    @invariant()
    def dead_letter_groups_match_the_model(self) -> None:
        """The groups of each dead-letter queue (read from the aggregates the store keeps in
        the transaction that moves a message) count its messages by reason, locked or not,
        and the audit finds them equal to a recount."""
        if not self.ready:
            return
        self._as_read()
        for entity, address in ((DEAD, DLQ), (REJECTED, NAMESPACE_DLQ)):
            if entity == REJECTED and not any(m.where == REJECTED for m in self.msgs.values()):
                continue
            model = Counter(m.reason for m in self.msgs.values() if m.where == entity)
            groups = self.broker.dead_letter_groups(address, "reason")
            assert {g.key: g.count for g in groups} == dict(model)
            assert [g.count for g in groups] == sorted(model.values(), reverse=True)
        assert all(entry.aggregates_match for entry in self.broker.audit().entries)

    @invariant()
    def every_message_sent_is_accounted_for(self) -> None:
        """sent = completed + dead-lettered + dropped + held (docs/design.md, the invariant)."""
        if not self.ready:
            return
        self._as_read()
        main, dlq = self.broker.counts(Q), self.broker.counts(DLQ)
        held = main["active"] + main["scheduled"] + main["locked"] + main["deferred"]
        held += sum(self.broker.counts(RETRY_Q)[s] for s in ("scheduled", "active"))
        if any(m.where == REJECTED for m in self.msgs.values()):
            held += self.broker.counts(NAMESPACE_DLQ)["dead_lettered"]
        completed = main["completed"] + dlq["completed"]
        dropped = main["dropped"] + dlq["dropped"]
        assert self.sent == completed + main["dead_lettered"] + dropped + held
        report = self.broker.audit()
        assert report.ok
        assert report.sent == self.sent
        assert_balanced(self.broker)


# As many examples as the profile says: 100 in `make test`, 25 in `make check`.
QueueMachine.TestCase.settings = settings(
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# A failure is shrunk for up to 5 minutes (hypothesis' own limit): let it finish and report.
TestQueueStateMachine = pytest.mark.timeout(600)(QueueMachine.TestCase)


class AioQueueMachine(QueueMachine):
    """The same machine through poisonq.aio (an AsyncBroker driven from the machine's steps,
    ``tests/aio_driver.py``): every rule but the leases, which are the Spark runtime's and
    not part of the asyncio API."""

    LEASES = False

    def connect(self) -> contextlib.AbstractContextManager[Broker]:
        return aio_driver.connect(self.store_url(), self.clock)


AioQueueMachine.TestCase.settings = settings(QueueMachine.TestCase.settings, max_examples=30)
# Slow: `make check` keeps the sync machine; `make test` runs both.
TestAioQueueMachine = pytest.mark.slow(pytest.mark.timeout(600)(AioQueueMachine.TestCase))


class PostgresQueueMachine(QueueMachine):
    """The same machine on PostgreSQL, each example in a schema of its own."""

    server: ClassVar[TemporaryServer | None] = None

    def store_url(self) -> str:
        assert self.server is not None, "set by the test below"
        schema = f"machine_{uuid.uuid4().hex[:16]}"
        self.server.execute(f"CREATE SCHEMA {schema}", database="poisonq")
        return self.server.database_url("poisonq") + f"?options=-csearch_path%3D{schema}"


@pytest.mark.timeout(600)
def test_the_state_machine_on_postgresql(
    pg_server: TemporaryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PostgresQueueMachine, "server", pg_server)
    run_state_machine_as_test(
        PostgresQueueMachine,
        settings=settings(QueueMachine.TestCase.settings, max_examples=30),
    )


# Contract violations the machine steers around ------------------------------------------------
def test_a_deferred_message_past_its_ttl_stays_deferred_and_is_delivered(
    broker: Broker, clock: ManualClock
) -> None:
    """Service Bus never moves a deferred message to the dead-letter queue when it expires:
    past its TTL it is still deferred, to every reader, and ``receive_deferred`` gets it."""
    broker.create_queue(Q, max_delivery_count=3)
    (seq,) = broker.sender(Q).send(Message(body=b"x", time_to_live=60))
    receiver = broker.receiver(Q)
    receiver.defer(receiver.receive())
    clock.advance(61)
    assert broker.counts(Q)["deferred"] == 1 and broker.counts(DLQ)["dead_lettered"] == 0
    [seen] = broker.peek(Q)
    assert seen.state is MessageState.DEFERRED
    [got] = receiver.receive_deferred(seq)
    assert (got.sequence_number, got.delivery_count) == (seq, 2)
    receiver.abandon(got)  # back to active, where its TTL applies again
    assert broker.counts(Q)["active"] == 0
    [dead] = broker.peek(DLQ)
    assert dead.sequence_number == seq and dead.dead_letter_reason == "TTLExpiredException"
    assert_balanced(broker)


def test_a_deferred_message_is_never_delivered_past_max_delivery_count(broker: Broker) -> None:
    broker.create_queue(Q, max_delivery_count=1)
    (seq,) = broker.sender(Q).send(Message(body=b"x"))
    receiver = broker.receiver(Q)
    (first,) = receiver.receive()
    assert first.delivery_count == 1
    receiver.defer(first)
    assert receiver.receive_deferred(seq) == []
    [dead] = broker.peek(f"{Q}/$deadletterqueue")
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.delivery_count == 1  # the refused delivery is not counted


@pytest.mark.parametrize("action", ["drop", "fault"])
def test_a_spent_deferred_message_gets_the_queues_poison_action(
    broker: Broker, action: str
) -> None:
    """A deferred message whose deliveries are spent gets the queue's poison action (not
    always the dead-letter queue)."""
    policy = RetryPolicy(receive_retry_count=0, receive_error_handling=action)
    broker.create_queue(Q, retry=policy)
    (seq,) = broker.sender(Q).send(Message(body=b"x"))
    receiver = broker.receiver(Q)
    receiver.defer(receiver.receive())
    assert receiver.receive_deferred(seq) == []
    counts = broker.counts(Q)
    assert counts["dead_lettered"] == 0 and counts["deferred"] == 0
    if action == "drop":
        assert counts["dropped"] == 1
    else:
        assert counts["active"] == 1 and broker.get_queue(Q).status.value != "active"
    assert_balanced(broker)
