"""The plans PostgreSQL picks for a receive stay on the index that holds ready messages in
order, also when its statistics are stale (what the queue benchmark ran into: a receive that
walked the primary key past every dead-lettered message, a scan of the table per batch)."""

from __future__ import annotations

import psycopg

import poisonq
from poisonq import Message
from poisonq.store.postgres.batches import ready_seqs


def _plan(conn: psycopg.Connection, params: dict[str, object], session: bool = False) -> str:
    rows = conn.execute(f"EXPLAIN SELECT {ready_seqs(session=session)}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_a_receive_walks_the_ready_index_even_with_stale_statistics(pg_url: str) -> None:
    with poisonq.connect(pg_url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([Message(body=b"x" * 200) for _ in range(3000)])
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ANALYZE messages")  # statistics: 3000 active messages of one queue
            receiver = broker.receiver("orders")
            for _ in range(25):  # most of them dead-lettered since
                batch = receiver.receive(max_messages=100)
                receiver.dead_letter(batch, reason="Bad")
            (entity,) = (
                conn.execute("SELECT id FROM entities WHERE name = 'orders'").fetchone() or ()
            )
            params = {"entity": entity, "ready": "active", "limit": 100, "session": None}
            plan = _plan(conn, params)
            assert "messages_by_state" in plan
            assert "messages_pkey" not in plan
            plan = _plan(conn, {**params, "session": "s1"}, session=True)
            assert "messages_by_session" in plan
            assert "messages_pkey" not in plan
        assert len(receiver.receive(max_messages=100)) == 100  # exactly the batch asked for


def test_the_housekeeping_probes_seek_each_entity_by_its_indexes(pg_url: str) -> None:
    """Every read asks them first: they must not scan the table. Unfenced, the planner walked
    every active message of the entity by the state index for the probe by time to live,
    and probed all the entities of a listing with one hashed scan of every message."""
    from poisonq.store.postgres.transaction import PostgresTransaction

    with poisonq.connect(pg_url) as broker:
        for name in ("orders", "payments"):
            broker.create_queue(name)
            broker.sender(name).send([Message(body=b"x") for _ in range(3000)])
        broker.receiver("orders").receive(max_messages=10)
        probes = PostgresTransaction._probes(
            PostgresTransaction.__new__(PostgresTransaction), "e.id", "(e.id)"
        )
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ANALYZE messages")
            sql = f"EXPLAIN SELECT name FROM entities e WHERE {probes}"
            plan = "\n".join(r[0] for r in conn.execute(sql.replace(":now", "1e12")))
    assert "Seq Scan on messages" not in plan and "hashed" not in plan, plan
    assert "messages_expiring" in plan, plan
