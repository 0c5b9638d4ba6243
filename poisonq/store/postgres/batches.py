"""Statements over whole batches: how a lease locks its messages, and what a bulk task
selects (locked, for the task's next step). The rest of leases and tasks is shared
(:mod:`poisonq.store.leases_sql`, :mod:`poisonq.store.tasks_sql`)."""

from __future__ import annotations

from typing import Any

from poisonq.model import Lease, MessageState
from poisonq.store.base import MessageFilter
from poisonq.store.dead_letters_sql import DeadLetterAnalysis
from poisonq.store.leases_sql import LeaseStatements
from poisonq.store.postgres.runner import StatementRunner
from poisonq.store.rows import filter_sql


def filter_clauses(where: MessageFilter) -> tuple[str, list[Any]]:
    """The clauses of :func:`poisonq.store.rows.filter_sql` in PostgreSQL's dialect."""
    return filter_sql(where, "%b", "position(%b IN body) > 0")


def in_index_order(columns: str, key: str, also: str = "") -> str:
    """``WHERE`` and ``ORDER BY`` for the messages whose leading ``columns`` equal ``key``
    (and that meet the condition ``also``), in the order of the index on ``columns`` (its
    last column is ``seq``).

    They are named as a range of that index (a row comparison on its columns), never as
    equalities: with ``entity_id = ... AND state = ...`` the planner may walk the primary key
    in sequence order instead, filtering, and when its statistics are stale (a queue drained
    or dead-lettered since the last ANALYZE) that walk passes every message of other entities
    and states first, a scan of the table per receive. A range of the index leaves it no
    other ordered path."""
    return (
        f"WHERE ({columns}) > ({key}, 0) AND ({columns}) < ({key}, {2**63 - 1})"
        + (f" AND {also}" if also else "")
        + f" ORDER BY {columns}"
    )


def ready_seqs(*, session: bool = False) -> str:
    """The sequence numbers of the ``limit`` oldest messages of ``entity`` in state ``ready``
    (of one ``session``), locked for the statement they are part of, as an array.
    ``ARRAY(...)`` runs the subquery once: as ``seq IN (subquery)`` a plan may run it again
    per row and lock more than ``limit``."""
    if session:  # messages_by_session, which holds only messages with a session id
        order = in_index_order(
            "entity_id, session_id, state, seq",
            "%(entity)b, %(session)b, %(ready)b",
            also="session_id IS NOT NULL",
        )
    else:  # messages_by_state
        order = in_index_order("entity_id, state, seq", "%(entity)b, %(ready)b")
    return f"ARRAY(SELECT seq FROM messages {order} LIMIT %(limit)b FOR UPDATE SKIP LOCKED)"


class BatchQueries(LeaseStatements, DeadLetterAnalysis, StatementRunner):
    # Leases -------------------------------------------------------------------------------
    # A lease's messages are locked row by row, so that competing consumers skip them as
    # they skip any lock (SKIP LOCKED).
    def lock_lease(
        self,
        entity_id: int,
        name: str,
        consumer: str,
        number: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        now: float,
    ) -> Lease | None:
        rows = self._lock_ready("seq", entity_id, ready, limit, token, locked_until)
        if not rows:
            return None
        seqs = sorted(row[0] for row in rows)
        lease = Lease(name, consumer, number, token, len(seqs), seqs[0], seqs[-1], now)
        self._insert_lease(entity_id, lease)
        return lease

    def close_expired_leases(self, entity_id: int, now: float) -> None:
        pass  # the expired locks were each a message's

    def _lock_ready(
        self,
        returning: str,
        entity_id: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        session_id: str | None = None,
        *,
        last: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Lock the ``limit`` oldest ready messages (of one session) under ``token`` until
        ``locked_until``, counting a delivery; returns the ``returning`` columns of each."""
        return self._fetch_all(
            "UPDATE messages SET state = 'locked', lock_token = %(token)b,"
            " locked_until = %(until)b, delivery_count = delivery_count + 1"
            f" WHERE seq = ANY({ready_seqs(session=session_id is not None)})"
            f" RETURNING {returning}",
            {
                "token": token,
                "until": locked_until,
                "entity": entity_id,
                "session": session_id,
                "ready": ready.value,
                "limit": limit,
            },
            last=last,
        )

    # Tasks --------------------------------------------------------------------------------
    def select(
        self,
        entity_id: int,
        where: MessageFilter,
        after_seq: int,
        limit: int,
        newest_first: bool = False,
    ) -> list[int]:
        clauses, params = filter_clauses(where)
        order = "DESC" if newest_first else "ASC"
        # Locked here, so a receiver cannot take them before the task moves or drops them.
        rows = self._fetch_all(
            "SELECT seq FROM messages WHERE entity_id = %b AND state != 'locked' AND seq > %b"
            f"{clauses} ORDER BY seq {order} LIMIT %b FOR UPDATE SKIP LOCKED",
            (entity_id, after_seq, *params, limit),
        )
        return [row[0] for row in rows]

    def count_matching(self, entity_id: int, where: MessageFilter, aggregated: bool = False) -> int:
        clauses, params = filter_clauses(where)
        kept = self._kept_count(entity_id, where) if aggregated else None
        if kept is not None:  # less the locked ones, found by the state index
            ((locked,),) = self._fetch_all(
                f"SELECT count(*) FROM messages WHERE entity_id = %b AND state = 'locked'{clauses}",
                (entity_id, *params),
            )
            return kept - int(locked)
        ((n,),) = self._fetch_all(
            f"SELECT count(*) FROM messages WHERE entity_id = %b AND state != 'locked'{clauses}",
            (entity_id, *params),
        )
        return int(n)
