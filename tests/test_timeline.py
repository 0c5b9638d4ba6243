"""Pipeline timelines on both stores: a completed lease records its batch (what became of
its messages, in the completing transaction), a consumer keeps only its last batches, and the
migration that adds them applies whether or not the schema before it was seen first."""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path

import pytest

import poisonq
from poisonq import Abandon, BatchRun, Broker, DeadLetter, ManualClock, Message
from poisonq.store.base import pending_migrations
from poisonq.store.sqlite import SqliteStore
from tests.helpers import script_versions


def _lease(broker: Broker, queue: str, number: int, count: int) -> poisonq.Lease:
    broker.sender(queue).send([Message(body=f"m{n}".encode()) for n in range(count)])
    lease = broker.acquire_lease(queue, "orders-job", number, max_messages=count)
    assert lease is not None
    return lease


def test_a_completed_lease_records_what_became_of_its_batch(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    lease = _lease(broker, queue, 1, 10)
    started = clock.now()
    clock.advance(2)
    seq = lease.min_sequence
    broker.settle_held(
        queue,
        [
            DeadLetter(seq, lease.lock_token, "InvalidOrder", "no id"),
            DeadLetter(seq + 1, lease.lock_token, "InvalidOrder", "no id"),
            DeadLetter(seq + 2, lease.lock_token, "KeyError", "'xx'"),
            Abandon(seq + 3, lease.lock_token),
        ],
    )
    clock.advance(1)
    run = BatchRun(started_at=started, seconds=3.0, isolation_jobs=4)
    assert broker.complete_lease(lease, run) == 6
    [batch] = broker.pipeline_batches("orders-job")
    assert (batch.queue, batch.consumer, batch.lease) == (queue, "orders-job", 1)
    assert (batch.started_at, batch.seconds, batch.isolation_jobs) == (started, 3.0, 4)
    assert (batch.size, batch.completed, batch.retried) == (10, 6, 1)
    assert batch.dead_lettered == {"InvalidOrder": 2, "KeyError": 1}
    assert batch.dead_lettered_total == 3
    assert batch.messages_per_second == pytest.approx(10 / 3)
    [summary] = broker.pipelines()
    assert (summary.queue, summary.consumer, summary.batches, summary.last) == (
        queue,
        "orders-job",
        1,
        batch,
    )


def test_dead_letters_outside_the_batch_job_are_not_its_own(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    """What the dead-letter queue took before the job started (an earlier batch's) or in
    other ranges is not counted, and a lease completed without a run records nothing."""
    first = _lease(broker, queue, 1, 3)
    broker.settle_held(queue, [DeadLetter(first.min_sequence, first.lock_token, "Early", None)])
    broker.complete_lease(first)
    assert broker.pipelines() == []
    clock.advance(5)
    second = _lease(broker, queue, 2, 3)
    started = clock.now()
    broker.settle_held(queue, [DeadLetter(second.max_sequence, second.lock_token, "Late", None)])
    broker.complete_lease(second, BatchRun(started, 1.0))
    [batch] = broker.pipeline_batches("orders-job", queue)
    assert batch.dead_lettered == {"Late": 1}
    assert (batch.completed, batch.retried) == (2, 0)


def test_a_consumer_keeps_its_last_batches_and_a_replay_replaces_its_record(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    for number in range(1, 6):
        lease = _lease(broker, queue, number, 2)
        broker.complete_lease(lease, BatchRun(clock.now(), 0.5, keep=3))
        clock.advance(1)
    assert [b.lease for b in broker.pipeline_batches("orders-job")] == [3, 4, 5]
    replayed = broker.lease(queue, "orders-job", 5)
    assert replayed is not None
    broker.complete_lease(replayed, BatchRun(clock.now(), 9.0, keep=3))
    batches = broker.pipeline_batches("orders-job")
    assert [(b.lease, b.seconds, b.completed) for b in batches] == [
        (3, 0.5, 2),
        (4, 0.5, 2),
        (5, 9.0, 0),
    ]
    assert broker.pipelines()[0].batches == 3


def test_an_unknown_consumer_or_one_on_two_queues_is_refused(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    lease = _lease(broker, queue, 1, 1)
    broker.complete_lease(lease, BatchRun(clock.now(), 1.0))
    with pytest.raises(poisonq.PipelineNotFoundError, match="did you mean 'orders-job'"):
        broker.pipeline_batches("orders-jb")
    with pytest.raises(poisonq.EntityNotFoundError):
        broker.pipeline_batches("orders-job", "nope")
    broker.create_queue("refunds")
    with pytest.raises(poisonq.PipelineNotFoundError, match="on queue 'refunds'"):
        broker.pipeline_batches("orders-job", "refunds")
    other = _lease(broker, "refunds", 1, 1)
    broker.complete_lease(other, BatchRun(clock.now(), 1.0))
    with pytest.raises(poisonq.InvalidOperationError, match="'orders', 'refunds'"):
        broker.pipeline_batches("orders-job")
    assert [b.queue for b in broker.pipeline_batches("orders-job", "refunds")] == ["refunds"]
    broker.delete_queue("refunds")  # its timeline goes with it
    assert [s.queue for s in broker.pipelines()] == [queue]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_every_script_a_store_has_not_applied_runs_whatever_came_first(kind: str) -> None:
    """Two branches may each add a script (8 and 9): a store that took 9 first still takes
    8 when it arrives, and one that took a sibling this poisonq does not know is not
    refused for it."""
    known = script_versions(kind)
    assert [v for v, _ in pending_migrations(kind, set(known[:-1]), "s")] == [known[-1]]
    below = set(known) - {known[-2]}
    assert [v for v, _ in pending_migrations(kind, below, "s")] == [known[-2]]
    assert pending_migrations(kind, {*known, known[-1] - 1}, "s") == []
    with pytest.raises(poisonq.StoreError, match="knows up to"):
        pending_migrations(kind, {known[-1] + 1}, "s")


def test_a_store_that_took_the_timeline_first_takes_an_earlier_script_later(
    tmp_path: Path,
) -> None:
    """A SQLite file given 9 before 7 ends with the schema of a fresh install."""
    folder = resources.files("poisonq.store") / "migrations" / "sqlite"
    scripts = {int(p.name.split("_")[0]): p.read_text() for p in folder.iterdir()}
    old = sqlite3.connect(tmp_path / "old.db")
    old.execute("CREATE TABLE poisonq_schema (version INTEGER NOT NULL) STRICT")
    # The scripts that store had: those up to the timeline's (9). The ones after came with a
    # poisonq that has 7 too, and a store takes what it lacks in order, so they run after 7.
    for version in [v for v in script_versions("sqlite") if v != 7 and v <= 9]:
        old.executescript(scripts[version])
        old.execute("INSERT INTO poisonq_schema (version) VALUES (?)", (version,))
    old.commit()
    old.close()
    SqliteStore(tmp_path / "old.db").close()
    SqliteStore(tmp_path / "new.db").close()

    def schema(path: Path) -> set[tuple[str, str]]:
        with sqlite3.connect(path) as db:
            return set(db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))

    assert schema(tmp_path / "old.db") == schema(tmp_path / "new.db")
