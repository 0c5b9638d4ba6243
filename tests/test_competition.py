"""Several processes on one store: competing consumers, a consumer killed with SIGKILL, random
abandons and lock expiries under load, and the guarantee that no two receivers hold the same
message under valid locks. Every test runs on a SQLite file and on a PostgreSQL database.

Workers are separate processes started with ``spawn`` (a fresh interpreter each, as separate
services would be) and use the real clock. They write what they did to a JSON file of their
own; the parent checks those records against the broker's counts and the audit. Waits are
bounded: every join has a timeout, and a worker that is still alive then fails the test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from collections import Counter
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest

import poisonq
from poisonq import MessageLockLostError
from tests.helpers import SPAWN, START_TIMEOUT, assert_balanced, fill, kill_while_holding

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RUN_TIMEOUT = 50.0
CHURN_TIMEOUT = 240.0
ABANDON, EXPIRE = 0.03, 0.01  # the share of deliveries abandoned, and left to expire


# Workers (module level, so that spawned interpreters can import them) -------------------------
def _record(message: poisonq.ReceivedMessage) -> dict[str, Any]:
    return {
        "seq": message.sequence_number,
        "message_id": message.message_id,
        "body": message.text,
        "delivery_count": message.delivery_count,
        "abort_count": message.abort_count,
    }


def _consume(
    url: str,
    queue: str,
    out: str,
    start: Barrier,
    lock_duration: float | None,
    combined: bool,
    batch: int,
    progress: Event | None = None,
) -> None:
    """Receive with peek-lock and complete until nothing is left to receive, anywhere.

    ``out`` gets one JSON line per message *before* completing it (``intent``) and one after
    the completion committed (``done``), so a worker killed at any point leaves a record of
    everything it may have completed. With ``combined``, completions ride on the next receive
    (:meth:`Receiver.complete_and_receive`).
    """
    with poisonq.connect(url) as broker, open(out, "a", buffering=1) as log:
        receiver = broker.receiver(queue, lock_duration=lock_duration)
        start.wait(START_TIMEOUT)
        deadline = time.monotonic() + RUN_TIMEOUT
        held: list[poisonq.ReceivedMessage] = []

        def note(kind: str, messages: list[poisonq.ReceivedMessage]) -> None:
            for message in messages:
                log.write(json.dumps({"kind": kind, **_record(message)}) + "\n")

        while time.monotonic() < deadline:
            if held:
                note("intent", held)
                try:
                    got = receiver.complete_and_receive(held, max_messages=batch, max_wait=0.5)
                    note("done", held)
                except MessageLockLostError:
                    got = []  # nothing completed, nothing received: the messages come back
                held = []
            else:
                got = receiver.receive(max_messages=batch, max_wait=0.5)
            if got:
                if combined:
                    held = got
                    continue
                note("intent", got)
                try:
                    receiver.complete(got)
                    note("done", got)
                except MessageLockLostError:
                    pass  # the locks expired: someone else gets these messages again
                if progress is not None:
                    progress.set()
                continue
            # Nothing to receive. Messages locked by others may still come back (their locks
            # may expire), so stop only when nothing is active or locked at all.
            counts = broker.counts(queue)
            if counts["active"] + counts["locked"] + counts["scheduled"] == 0:
                return
        raise TimeoutError(f"{queue} was not drained within {RUN_TIMEOUT} s")


def _receive_and_hang(url: str, queue: str, n: int, out: str, holding: Event) -> None:
    """Lock ``n`` messages, say so, and hang until killed."""
    with poisonq.connect(url) as broker:
        got = broker.receiver(queue).receive(max_messages=n)
        Path(out).write_text(json.dumps([_record(m) for m in got]))
        holding.set()
        time.sleep(RUN_TIMEOUT)


def _hold(url: str, queue: str, out: str, start: Barrier, seed: int) -> None:
    """Receive without settling until the queue has nothing left; record every lock."""
    rng = random.Random(seed)
    held: list[dict[str, Any]] = []
    with poisonq.connect(url) as broker:
        receiver = broker.receiver(queue)
        start.wait(START_TIMEOUT)
        while got := receiver.receive(max_messages=rng.randint(1, 10)):
            held += [{**_record(m), "lock_token": m.lock_token} for m in got]
    Path(out).write_text(json.dumps(held))


def _churn(url: str, queue: str, out: str, start: Barrier, seed: int) -> None:
    """Receive batches and, for each message, mostly complete it, sometimes abandon it, and
    now and then walk away from it so that its lock expires. Records ``done`` per message
    once its completion committed and ``abandoned`` per abandon. Stops when the queue has
    nothing active, scheduled or locked left."""
    rng = random.Random(seed)
    with poisonq.connect(url) as broker, open(out, "a", buffering=1) as log:
        receiver = broker.receiver(queue)
        start.wait(START_TIMEOUT)
        deadline = time.monotonic() + CHURN_TIMEOUT
        while time.monotonic() < deadline:
            got = receiver.receive(max_messages=rng.randint(20, 100), max_wait=0.5)
            if not got:
                counts = broker.counts(queue)
                if counts["active"] + counts["locked"] + counts["scheduled"] == 0:
                    return
                continue
            fate = [rng.random() for _ in got]
            complete = [m for m, f in zip(got, fate, strict=True) if f >= ABANDON + EXPIRE]
            abandon = [m for m, f in zip(got, fate, strict=True) if f < ABANDON]
            try:
                if abandon:
                    receiver.abandon(abandon, error=RuntimeError("random abandon"))
                    for m in abandon:
                        log.write(json.dumps({"kind": "abandoned", **_record(m)}) + "\n")
                receiver.complete(complete)
                for m in complete:
                    log.write(json.dumps({"kind": "done", **_record(m)}) + "\n")
            except MessageLockLostError:
                pass  # slower than the lock: nothing changed, the messages come back
        raise TimeoutError(f"{queue} was not drained within {CHURN_TIMEOUT} s")


# Helpers --------------------------------------------------------------------------------------
def _run(
    processes: list[Any], start: Barrier | None = None, run_timeout: float = RUN_TIMEOUT
) -> None:
    """Start, release together, and join every process; kill any still alive at the end."""
    try:
        for process in processes:
            process.start()
        if start is not None:
            start.wait(START_TIMEOUT)
        deadline = time.monotonic() + START_TIMEOUT + run_timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        assert all(not p.is_alive() for p in processes), "a worker did not finish in time"
        assert [p.exitcode for p in processes] == [0] * len(processes)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _done(paths: list[Path]) -> list[dict[str, Any]]:
    return [r for path in paths for r in _lines(path) if r["kind"] == "done"]


def _consumers(
    url: str, queue: str, tmp: Path, n: int, start: Barrier, lock: float | None, batch: int
) -> tuple[list[Any], list[Path]]:
    outs = [tmp / f"{queue}-consumer-{i}.jsonl" for i in range(n)]
    processes = [
        SPAWN.Process(
            target=_consume,
            args=(url, queue, str(out), start, lock, i % 2 == 1, batch),
            name=f"{queue}-consumer-{i}",
        )
        for i, out in enumerate(outs)
    ]
    return processes, outs


# Tests ----------------------------------------------------------------------------------------
def test_four_processes_complete_20000_messages_exactly_once(url: str, tmp_path: Path) -> None:
    n = 20_000
    with poisonq.connect(url) as broker:
        broker.create_queue("work")
        seqs = fill(broker, "work", n)
        assert len(set(seqs)) == n
        start = SPAWN.Barrier(5)
        processes, outs = _consumers(url, "work", tmp_path, 4, start, None, 100)
        _run(processes, start)

        done = _done(outs)
        per_seq = Counter(r["seq"] for r in done)
        assert per_seq.keys() == set(seqs)
        assert max(per_seq.values()) == 1, "a message was completed twice"
        by_seq = {r["seq"]: r for r in done}
        for i, seq in enumerate(seqs):  # each record is the message that was sent
            assert (by_seq[seq]["message_id"], by_seq[seq]["body"]) == (f"m{i}", f"b{i}")
        counts = broker.counts("work")
        assert counts["completed"] == n
        assert counts["active"] + counts["locked"] + counts["scheduled"] + counts["deferred"] == 0
        assert counts["dead_lettered"] == 0
        assert broker.audit().ok
        assert_balanced(broker)


def test_locks_of_a_killed_receiver_expire_and_its_messages_are_delivered_again(
    url: str, tmp_path: Path
) -> None:
    with poisonq.connect(url) as broker:
        broker.create_queue("crash", lock_duration=2, max_delivery_count=5)
        seqs = fill(broker, "crash", 50)

        holding = SPAWN.Event()
        victim_out = tmp_path / "victim.json"
        victim = SPAWN.Process(
            target=_receive_and_hang, args=(url, "crash", 20, str(victim_out), holding)
        )
        kill_while_holding(victim, holding)  # it holds 20 locks
        taken = json.loads(victim_out.read_text())
        assert [r["seq"] for r in taken] == seqs[:20]
        assert all(r["delivery_count"] == 1 for r in taken)
        counts = broker.counts("crash")
        assert counts["completed"] == 0
        assert counts["active"] + counts["locked"] == 50  # nothing lost with the process

        # Rescuers lock for 30 s, so only the victim's 2 s locks can expire in this test.
        start = SPAWN.Barrier(3)
        processes, outs = _consumers(url, "crash", tmp_path, 2, start, 30, 7)
        _run(processes, start)

        done = _done(outs)
        per_seq = Counter(r["seq"] for r in done)
        assert per_seq.keys() == set(seqs) and max(per_seq.values()) == 1
        by_seq = {r["seq"]: r for r in done}
        for seq in seqs[:20]:  # the victim's: one delivery to it, one expiry, one more
            assert (by_seq[seq]["delivery_count"], by_seq[seq]["abort_count"]) == (2, 1)
        for seq in seqs[20:]:
            assert (by_seq[seq]["delivery_count"], by_seq[seq]["abort_count"]) == (1, 0)
        counts = broker.counts("crash")
        assert counts["completed"] == 50
        assert counts["active"] + counts["locked"] + counts["dead_lettered"] == 0
        assert broker.get_queue("crash").ledger.lock_expiries == 20
        assert_balanced(broker)


def test_a_consumer_killed_at_any_moment_loses_and_duplicates_nothing(
    url: str, tmp_path: Path
) -> None:
    """SIGKILL lands wherever the busy consumer is: between transactions or inside one."""
    n = 3000
    with poisonq.connect(url) as broker:
        broker.create_queue("busy", lock_duration=1, max_delivery_count=10)
        seqs = fill(broker, "busy", n)

        start, progress = SPAWN.Barrier(2), SPAWN.Event()
        victim_out = tmp_path / "busy-victim.jsonl"
        victim = SPAWN.Process(
            target=_consume,
            args=(url, "busy", str(victim_out), start, None, False, 10, progress),
        )
        try:
            victim.start()
            start.wait(START_TIMEOUT)
            assert progress.wait(RUN_TIMEOUT), "the victim completed nothing"
            time.sleep(random.uniform(0.0, 0.2))  # somewhere in its work, not at a boundary
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
        finally:
            if victim.is_alive():
                victim.kill()
                victim.join(5)
        victim_lines = _lines(victim_out)
        victim_done = {r["seq"] for r in victim_lines if r["kind"] == "done"}
        victim_intent = {r["seq"] for r in victim_lines if r["kind"] == "intent"}
        assert victim_done, "the victim completed nothing"
        assert victim_done <= victim_intent

        start = SPAWN.Barrier(3)
        processes, outs = _consumers(url, "busy", tmp_path, 2, start, 30, 50)
        _run(processes, start)

        rescued = Counter(r["seq"] for r in _done(outs))
        assert max(rescued.values(), default=1) == 1
        assert not rescued.keys() & victim_done, "completed by the victim and again later"
        # Everything was completed by a rescuer, or by the victim (perhaps in the very
        # transaction it was killed after, before it could write "done").
        assert rescued.keys() | victim_intent >= set(seqs)
        counts = broker.counts("busy")
        assert counts["completed"] == n  # each message exactly once: the store's count
        assert counts["active"] + counts["locked"] + counts["dead_lettered"] == 0
        assert_balanced(broker)


def test_competing_processes_never_hold_the_same_message(url: str, tmp_path: Path) -> None:
    n = 2000
    with poisonq.connect(url) as broker:
        broker.create_queue("locks", lock_duration=120)  # nothing expires during the test
        seqs = fill(broker, "locks", n)
        start = SPAWN.Barrier(5)
        outs = [tmp_path / f"holder-{i}.json" for i in range(4)]
        processes = [
            SPAWN.Process(target=_hold, args=(url, "locks", str(out), start, i))
            for i, out in enumerate(outs)
        ]
        _run(processes, start)

        held = [json.loads(out.read_text()) for out in outs]
        sets = [{r["seq"] for r in records} for records in held]
        assert sum(len(s) for s in sets) == sum(len(records) for records in held)
        for i, mine in enumerate(sets):
            for theirs in sets[i + 1 :]:
                assert not mine & theirs, f"held by two processes at once: {mine & theirs}"
        assert set().union(*sets) == set(seqs)
        tokens = {r["seq"]: r["lock_token"] for records in held for r in records}
        assert all(r["delivery_count"] == 1 for records in held for r in records)

        # The broker agrees that all are held; and since no lock expired, every recorded lock
        # is valid now, at once: completing all of them with the recorded tokens succeeds.
        peeked = broker.peek("locks", max_messages=n)
        assert {m.sequence_number for m in peeked} == set(tokens)
        assert all(m.state == "locked" and m.lock_token is None for m in peeked)
        assert broker.counts("locks")["locked"] == n
        with_tokens = [dataclasses.replace(m, lock_token=tokens[m.sequence_number]) for m in peeked]
        broker.receiver("locks").complete(with_tokens)
        counts = broker.counts("locks")
        assert (counts["completed"], counts["locked"]) == (n, 0)
        assert_balanced(broker)


@pytest.mark.timeout(400)
def test_many_processes_with_abandons_and_lock_expiries_complete_50000_messages_once(
    url: str, tmp_path: Path
) -> None:
    """8 consumers on PostgreSQL (4 on SQLite, which has one writer at a time) share 50,000
    messages; about 3 % of deliveries are abandoned and 1 % left to expire (2 s locks)."""
    n, consumers = 50_000, 8 if url.startswith("postgresql") else 4
    with poisonq.connect(url) as broker:
        broker.create_queue("churn", lock_duration=2, max_delivery_count=100)
        seqs = fill(broker, "churn", n, chunk=5000)
        start = SPAWN.Barrier(consumers + 1)
        outs = [tmp_path / f"churn-{i}.jsonl" for i in range(consumers)]
        processes = [
            SPAWN.Process(target=_churn, args=(url, "churn", str(out), start, i))
            for i, out in enumerate(outs)
        ]
        _run(processes, start, CHURN_TIMEOUT)

        records = [r for out in outs for r in _lines(out)]
        done = Counter(r["seq"] for r in records if r["kind"] == "done")
        assert done.keys() == set(seqs), "a message was lost"
        assert max(done.values()) == 1, "a message was completed twice"
        info = broker.get_queue("churn")
        assert info.counts["completed"] == n
        assert sum(info.counts[s] for s in ("active", "locked", "scheduled", "deferred")) == 0
        assert info.counts["dead_lettered"] == 0
        # The churn really happened: abandons and lock expiries, all redelivered and finished.
        abandoned = sum(r["kind"] == "abandoned" for r in records)
        assert abandoned > n * ABANDON / 2
        assert info.ledger.lock_expiries > n * EXPIRE / 2
        assert sum(p.exitcode == 0 for p in processes) == consumers
        assert_balanced(broker)
