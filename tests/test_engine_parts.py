"""The engine's collaborators used alone, on a real store: what each one's interface promises."""

from __future__ import annotations

import pytest

from poisonq import Broker, EntityNotFoundError, ManualClock, Message
from poisonq.engine.driving import drive
from poisonq.engine.poison import Poisoner
from poisonq.engine.resolving import Resolver
from poisonq.engine.routing import Router
from poisonq.model import MessageState, SubQueue
from poisonq.store.shared_sql import for_postgres


def test_the_resolver_names_a_subqueue_and_the_queue_whose_options_govern_it(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    resolver = Resolver(clock)

    async def resolve() -> None:
        async with broker.store.transaction() as tx:
            target = await resolver.resolve(tx, f"{queue}/$deadletterqueue")
            assert (target.entity.subqueue, target.queue.name) == (SubQueue.DEADLETTER, queue)
            assert target.ready is MessageState.DEAD_LETTERED
            assert target.options.max_delivery_count == 3
            with pytest.raises(EntityNotFoundError, match="ordres") as missing:
                await resolver.resolve(tx, "ordres")
            assert "orders" in str(missing.value)

    drive(resolve())


def test_the_poisoner_dead_letters_a_message_out_of_deliveries(
    broker: Broker, queue: str, clock: ManualClock
) -> None:
    broker.sender(queue).send(Message(body=b"x"))
    for _ in range(3):
        [message] = broker.receiver(queue).receive()
        if message.delivery_count < 3:
            broker.receiver(queue).abandon(message)
    resolver = Resolver(clock)
    poisoner = Poisoner(resolver, Router(resolver), clock)

    async def fail() -> list[int]:
        async with broker.store.transaction() as tx:
            target = await resolver.resolve(tx, queue)
            token, seqs = message.lock_token or "", [message.sequence_number]
            locks = await tx.locked(target.entity.id, token, seqs, clock.now())
            return await poisoner.after_failure(tx, target, locks, None, lock_expired=False)

    assert drive(fail()) == [message.sequence_number]
    [dead] = broker.peek(f"{queue}/$deadletterqueue")
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_a_statement_written_once_gets_postgresql_parameters_and_keeps_its_casts() -> None:
    sql = "SELECT :entity::bigint FROM t WHERE a = :entity AND b <= :until2"
    assert for_postgres(sql) == (
        "SELECT %(entity)b::bigint FROM t WHERE a = %(entity)b AND b <= %(until2)b"
    )
    with pytest.raises(ValueError, match="quoted literal"):
        for_postgres("SELECT 'a:b' FROM t WHERE a = :entity")
