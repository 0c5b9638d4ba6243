"""The dead-letter queues' kept aggregates: the groups (by reason, subject and fingerprint),
the causes and the counts of a selection are read from counts the store keeps in the
transaction that moves a message, so they follow every way into and out of a dead-letter queue,
the audit recounts them, a database from before them is backfilled, and two clients
dead-lettering side by side on PostgreSQL lose no update and never deadlock."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import poisonq
from poisonq import NO_VALUE, Broker, Message
from poisonq.clock import ManualClock
from poisonq.engine.driving import drive
from poisonq.model import DEAD_LETTER_QUEUES, FailureRecord, MessageState, SubQueue
from poisonq.names import subqueue_name
from poisonq.store.base import NewMessage
from tests.helpers import assert_balanced, execute_behind_the_back


def _groups(broker: Broker, queue: str, by: str = "reason") -> dict[str | None, int]:
    return {g.key: g.count for g in broker.dead_letter_groups(queue, by)}


def _aggregates_match(broker: Broker) -> bool:
    return all(entry.aggregates_match for entry in broker.audit().entries)


def _dead_letter(broker: Broker, queue: str, reasons: list[str], **fields: object) -> None:
    broker.sender(queue).send([Message(body=b"x", **fields) for _ in reasons])  # type: ignore[arg-type]
    receiver = broker.receiver(queue)
    for message, reason in zip(receiver.receive(max_messages=len(reasons)), reasons, strict=True):
        receiver.dead_letter(message, reason)


def test_the_groups_follow_every_move_into_and_out_of_the_dead_letter_queue(
    broker: Broker, clock: ManualClock
) -> None:
    """Dead-lettering, a TTL that runs out, a receive and complete from the dead-letter
    queue, a resubmit and a purge each change the groups in their own transaction, and the
    audit finds the aggregates equal to a recount after each."""
    broker.create_queue("orders", dead_lettering_on_message_expiration=True)
    _dead_letter(broker, "orders", ["Invalid", "Invalid", "Invalid", "Late"], subject="order")
    assert _groups(broker, "orders") == {"Invalid": 3, "Late": 1}
    assert _groups(broker, "orders", "subject") == {"order": 4}
    broker.sender("orders").send(Message(body=b"y", time_to_live=5))
    clock.advance(6)
    assert _groups(broker, "orders") == {"Invalid": 3, "Late": 1, "TTLExpiredException": 1}
    assert _aggregates_match(broker)
    dlq = broker.receiver("orders/$deadletterqueue")
    (first,) = dlq.receive(max_messages=1)
    assert _groups(broker, "orders")["Invalid"] == 3  # a locked dead letter is still held
    assert broker.count_dead_letters("orders", reason="Invalid") == 2  # but not selectable
    dlq.complete(first)
    assert _groups(broker, "orders") == {"Invalid": 2, "Late": 1, "TTLExpiredException": 1}
    broker.resubmit("orders", reason="Late", rate=None)
    assert _groups(broker, "orders") == {"Invalid": 2, "TTLExpiredException": 1}
    broker.purge("orders", reason="Invalid")
    assert _groups(broker, "orders") == {"TTLExpiredException": 1}
    assert _aggregates_match(broker)
    assert_balanced(broker)


def test_an_abandon_in_the_dead_letter_queue_moves_a_message_to_its_new_fingerprint(
    broker: Broker, clock: ManualClock
) -> None:
    """A failure recorded on a dead letter (a handler of the dead-letter queue failed) gives
    it a new fingerprint: the fingerprint groups follow."""
    broker.create_queue("orders")
    _dead_letter(broker, "orders", ["Invalid"])
    assert _groups(broker, "orders", "fingerprint") == {None: 1}
    dlq = broker.receiver("orders/$deadletterqueue")
    dlq.abandon(dlq.receive(max_messages=1), error=KeyError("cust-17"))
    (group,) = broker.dead_letter_groups("orders", "fingerprint")
    (held,) = broker.dead_letters("orders")
    assert group.key == held.failures[-1].fingerprint and group.label == "KeyError"
    assert _aggregates_match(broker)


def test_a_resubmitted_fingerprint_keeps_its_error_type(broker: Broker) -> None:
    """The store keeps each fingerprint's error type and description after its messages
    leave, so a chart of the past names it by its type, not a bare key."""
    broker.create_queue("orders")
    broker.sender("orders").send(Message(body=b"x"))
    receiver = broker.receiver("orders")
    receiver.dead_letter(receiver.receive(), "Failed", error=KeyError("cust-17"))
    (group,) = broker.dead_letter_groups("orders", "fingerprint")
    broker.resubmit("orders", rate=None)
    assert broker.dead_letter_groups("orders", "fingerprint") == []
    kind, description = broker.dead_letter_fingerprints("orders")[group.key or ""]
    assert kind == "KeyError" and description is not None and "cust-17" in description


def test_a_selection_by_group_is_counted_from_the_aggregates(broker: Broker) -> None:
    """The count of a selection by reason, subject or fingerprint (none included) equals the
    count of the messages a resubmit would take."""
    broker.create_queue("orders")
    _dead_letter(broker, "orders", ["A", "A", "B"], subject="s")
    _dead_letter(broker, "orders", ["A"])
    assert broker.count_dead_letters("orders") == 4
    assert broker.count_dead_letters("orders", reason="A") == 3
    assert broker.count_dead_letters("orders", reason="A", subject=NO_VALUE) == 1
    assert broker.count_dead_letters("orders", fingerprint=NO_VALUE) == 4
    assert broker.count_dead_letters("orders", reason="C") == 0
    assert broker.count_dead_letters("orders", reason="A", min_sequence=0) == 3  # a scan
    page = broker.dead_letters("orders", reason="A", limit=2)
    assert [m.dead_letter_reason for m in page] == ["A", "A"]
    assert page[0].sequence_number < page[1].sequence_number


def test_what_the_store_inserts_into_a_dead_letter_queue_is_counted_in_its_groups(
    broker: Broker, clock: ManualClock
) -> None:
    """No operation of the engine sends to a dead-letter queue, but the store keeps the
    aggregates exact whatever it inserts: messages inserted into one, and copies resubmitted
    into one, are counted in its groups, and a fingerprint it had not held is named."""
    broker.create_queue("orders")
    broker.create_queue("returns")
    broker.sender("orders").send(Message(body=b"x"))
    receiver = broker.receiver("orders")
    failure = FailureRecord(clock.now(), "ValueError", "bad", fingerprint="f1")
    receiver.dead_letter(receiver.receive(), "Invalid", error=failure)
    (dead,) = broker.receiver("orders/$deadletterqueue").peek()

    async def insert_and_resubmit() -> None:
        async with broker.store.transaction() as tx:
            orders = await tx.entity(subqueue_name("orders", SubQueue.DEADLETTER))
            returns = await tx.entity(subqueue_name("returns", SubQueue.DEADLETTER))
            assert orders is not None and returns is not None
            row = NewMessage("m", b"x", 1, None, "order", None, None, None, None,
                             MessageState.DEAD_LETTERED, None, None)  # fmt: skip
            await tx.insert_messages(returns.id, [row, row], clock.now())
            seqs = [dead.sequence_number]
            assert await tx.resubmit(orders.id, seqs, returns.id, clock.now(), None)

    drive(insert_and_resubmit())
    assert _groups(broker, "returns", "subject") == {"order": 2, None: 1}
    assert _groups(broker, "returns", "fingerprint") == {None: 2, "f1": 1}
    assert broker.dead_letter_fingerprints("returns") == {"f1": ("ValueError", "bad")}
    assert _aggregates_match(broker)


def test_a_dead_letter_forwarded_to_a_disabled_queue_is_counted_where_it_lands(
    broker: Broker,
) -> None:
    """A dead letter the queue forwards (``forward_dead_lettered_messages_to``) to a queue
    that cannot take it moves on to the transfer dead-letter queue with its own reason: it is
    counted out of the dead-letter queue's groups and into the transfer one's."""
    broker.create_queue("errors")
    broker.create_queue("orders", forward_dead_lettered_messages_to="errors")
    broker.disable("errors")
    _dead_letter(broker, "orders", ["Invalid", "Late"])
    assert _groups(broker, "orders") == {}
    transfer = subqueue_name("orders", SubQueue.TRANSFER_DEADLETTER)
    assert {g.key: g.count for g in broker.dead_letter_groups(transfer)} == {
        "Invalid": 1,
        "Late": 1,
    }
    assert _aggregates_match(broker)
    assert_balanced(broker)


def test_what_the_store_moves_between_dead_letter_queues_is_counted_on_both_sides(
    broker: Broker, clock: ManualClock
) -> None:
    """No operation of the engine dead-letters out of a dead-letter queue, but the store keeps
    the aggregates exact whatever it moves: a dead letter moved, or dead-lettered again, from
    one dead-letter queue into another leaves the first's groups and joins the second's."""
    broker.create_queue("orders")
    broker.create_queue("returns")
    _dead_letter(broker, "orders", ["Invalid", "Invalid", "Late"])
    dlq = broker.receiver("orders/$deadletterqueue")
    (moved,) = dlq.peek()

    async def move(seq: int, token: str | None) -> list[int]:
        """Moved with ``token`` (dead-lettered again under the lock), else moved as is."""
        async with broker.store.transaction() as tx:
            orders, returns = [
                await tx.entity(subqueue_name(queue, SubQueue.DEADLETTER))
                for queue in ("orders", "returns")
            ]
            assert orders is not None and returns is not None
            if token is None:
                return await tx.move(orders.id, [seq], returns.id, None, None)
            now = clock.now()
            return await tx.dead_letter(
                orders.id, [seq], returns.id, "Again", None, "orders", None, now, token
            )

    assert drive(move(moved.sequence_number, None)) == [moved.sequence_number]
    (lettered,) = dlq.receive()
    assert drive(move(lettered.sequence_number, lettered.lock_token)) == [lettered.sequence_number]
    assert _groups(broker, "orders") == {"Late": 1}
    assert _groups(broker, "returns") == {"Invalid": 1, "Again": 1}
    assert _aggregates_match(broker)


def test_the_dead_letter_subqueues_are_the_ones_the_triggers_keep() -> None:
    """The engine's list of dead-letter subqueues is the one the schema's triggers name."""
    from importlib import resources

    script = (
        resources.files("poisonq.store")
        / "migrations"
        / "sqlite"
        / "0012_dead_letter_aggregates.sql"
    ).read_text()
    named = "IN (" + ", ".join(f"'{s.value}'" for s in DEAD_LETTER_QUEUES) + ")"
    assert script.count(named) >= 5
    assert SubQueue.RETRY not in DEAD_LETTER_QUEUES


# Schema 12 run again on a store of today makes the row triggers that schemas 15, 16 and 18
# dropped for the store's own counting: dropped again once it has backfilled.
_SQLITE_AFTER_12 = [
    "DROP TRIGGER dead_letter_aggregates_insert",
    "DROP TRIGGER dead_letter_aggregates_update",
    "DROP TRIGGER dead_letter_aggregates_delete",
]
_POSTGRES_BEFORE_12 = [
    "DROP VIEW dead_letter_counts",  # before the table of changes it reads
    "DROP TRIGGER dead_letter_changes_insert ON messages",
    "DROP TRIGGER dead_letter_changes_update ON messages",
    "DROP TRIGGER dead_letter_changes_delete ON messages",
    "DROP TABLE dead_letter_changes",
    "DROP FUNCTION poisonq_dead_letter_changes",
    "DROP FUNCTION poisonq_fold_dead_letter_changes",
]
_BEFORE_12 = [
    "DROP VIEW IF EXISTS dead_letter_counts",
    "DROP TABLE dead_letter_aggregates",
    "DROP TABLE dead_letter_fingerprints",
    "DROP INDEX messages_by_dead_letter_reason",
    "DROP INDEX messages_by_fingerprint",
    "DELETE FROM poisonq_schema WHERE version = 12",
]


def test_a_store_from_before_the_aggregates_is_backfilled_from_its_dead_letters(
    url: str, clock: ManualClock
) -> None:
    """Schema 12 counts what the dead-letter queues already hold as it creates the
    aggregates, and keeps them from then on."""
    with poisonq.connect(url, clock=clock) as broker:
        broker.create_queue("orders")
        _dead_letter(broker, "orders", ["A", "A", "B"])
    sqlite = url.startswith("sqlite")
    for statement in ([] if sqlite else _POSTGRES_BEFORE_12) + _BEFORE_12:
        execute_behind_the_back(url, statement)
    with poisonq.connect(url, clock=clock) as broker:
        assert _groups(broker, "orders") == {"A": 2, "B": 1}
        for statement in _SQLITE_AFTER_12 if sqlite else []:
            execute_behind_the_back(url, statement)
        _dead_letter(broker, "orders", ["B"])
        assert _groups(broker, "orders") == {"A": 2, "B": 2}
        assert _aggregates_match(broker)


@pytest.mark.parametrize(
    "key", ["ünïcødé", "emoji 🎉", "tab\tnew\nline", 'quote" back\\slash', "\x01 control", "\u2028"]
)
def test_a_group_of_any_text_is_selected_by_its_key(broker: Broker, key: str) -> None:
    """A selection by reason or subject finds the group the listing shows, whatever the
    key's characters: the CLI resubmits or purges a group only if it counts it first."""
    broker.create_queue("orders")
    _dead_letter(broker, "orders", [key, key, "other"], subject=key)
    assert _groups(broker, "orders")[key] == 2
    assert broker.count_dead_letters("orders", reason=key) == 2
    assert broker.count_dead_letters("orders", subject=key) == 3


def test_a_sqlite_store_whose_groups_fall_short_of_its_dead_letters_is_recounted_as_it_opens(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A process of a poisonq from before schema 18, still running when another upgraded the
    file, dead-letters without counting (its triggers are gone): the groups fall short of
    what the ledger holds. The next open recounts that queue's groups, and says so."""
    with poisonq.connect(sqlite_url) as broker:
        broker.create_queue("orders")
        broker.create_queue("returns")
        _dead_letter(broker, "orders", ["A", "A", "B"])
        _dead_letter(broker, "returns", ["C"])
    execute_behind_the_back(  # as the older process's moves leave them
        sqlite_url,
        "DELETE FROM dead_letter_aggregates WHERE reason = '\"A\"'",
    )
    with caplog.at_level("WARNING", "poisonq.store.sqlite"), poisonq.connect(sqlite_url) as broker:
        assert _groups(broker, "orders") == {"A": 2, "B": 1}
        assert _groups(broker, "returns") == {"C": 1}
        assert _aggregates_match(broker)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("the dead-letter groups of orders/$deadletterqueue did not add up")


def test_two_clients_dead_lettering_side_by_side_lose_no_update(pg_url: str) -> None:
    """On PostgreSQL, clients that dead-letter into one dead-letter queue at once, each
    settling several reasons per transaction in opposite orders, neither lose a count nor
    deadlock: each transaction folds its changes at commit, after the ledger has locked the
    queue's row, in key order."""
    rounds, per_round = 20, 6
    with poisonq.connect(pg_url) as broker:
        broker.create_queue("orders", lock_duration=300)
        sender = broker.sender("orders")
        for _ in range(2 * rounds):
            sender.send([Message(body=b"x") for _ in range(per_round)])
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def client(reasons: list[str]) -> None:
        try:
            with poisonq.connect(pg_url) as mine:
                receiver = mine.receiver("orders")
                start.wait()
                for _ in range(rounds):
                    batch = receiver.receive(max_messages=per_round)
                    for message, reason in zip(batch, reasons * per_round, strict=False):
                        receiver.dead_letter(message, reason)
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    threads = [
        threading.Thread(target=client, args=(["A", "B", "C"],)),
        threading.Thread(target=client, args=(["C", "B", "A"],)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    with poisonq.connect(pg_url) as broker:
        held = Counter({g.key: g.count for g in broker.dead_letter_groups("orders", "reason")})
        assert sum(held.values()) == 2 * rounds * per_round
        assert held == Counter(
            m.dead_letter_reason for m in broker.dead_letters("orders", limit=10_000)
        )
        assert _aggregates_match(broker)
        assert_balanced(broker)


@pytest.mark.parametrize("by", ["reason", "subject", "fingerprint"])
def test_groups_are_largest_first_then_the_group_without_a_key(broker: Broker, by: str) -> None:
    """The order the scan gave: count descending, then the group without a key, then by key."""
    broker.create_queue("orders")
    _dead_letter(broker, "orders", ["B", "A"], subject="s")
    _dead_letter(broker, "orders", ["C"])
    keys = [g.key for g in broker.dead_letter_groups("orders", by)]
    assert keys == {"reason": ["A", "B", "C"], "subject": ["s", None], "fingerprint": [None]}[by]
