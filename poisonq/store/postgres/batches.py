"""Statements over whole batches: what a receiver locks, and what a bulk task selects
(locked, for the task's next step), both beside the leases' covers (``covers.py``). The rest
of leases and tasks is shared (:mod:`poisonq.store.leases_sql`, :mod:`poisonq.store.tasks_sql`)."""

from __future__ import annotations

from typing import Any

from poisonq.model import MessageState
from poisonq.store.base import MessageFilter
from poisonq.store.dead_letters_sql import DeadLetterAnalysis
from poisonq.store.postgres.covers import COVERED, TOP, PostgresCovers, receivable
from poisonq.store.rows import filter_sql


def filter_clauses(where: MessageFilter) -> tuple[str, list[Any]]:
    """The clauses of :func:`poisonq.store.rows.filter_sql` in PostgreSQL's dialect."""
    return filter_sql(where, "%b", "position(%b IN body) > 0")


def named_filter(where: MessageFilter) -> tuple[str, dict[str, Any]]:
    """:func:`filter_clauses` with named parameters (``f0``, ``f1``, ...), for statements
    that name theirs."""
    clauses, params = filter_clauses(where)
    parts = clauses.split("%b")
    named = parts[0] + "".join(f"%(f{n})b{part}" for n, part in enumerate(parts[1:]))
    return named, {f"f{n}": value for n, value in enumerate(params)}


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
    """The sequence numbers of the ``limit`` oldest receivable messages of ``entity`` in
    state ``ready`` (of one ``session``), locked for the statement they are part of, as an
    array. ``ARRAY(...)`` runs the subquery once: as ``seq IN (subquery)`` a plan may run it
    again per row and lock more than ``limit``."""
    if not session:  # beside the leases' covers (sessions are never leased)
        return f"ARRAY({receivable('seq', ' FOR UPDATE SKIP LOCKED')})"
    # messages_by_session, which holds only messages with a session id
    order = in_index_order(
        "entity_id, session_id, state, seq",
        "%(entity)b, %(session)b, %(ready)b",
        also="session_id IS NOT NULL",
    )
    return f"ARRAY(SELECT seq FROM messages {order} LIMIT %(limit)b FOR UPDATE SKIP LOCKED)"


class BatchQueries(PostgresCovers, DeadLetterAnalysis):
    async def _lock_ready(
        self,
        returning: str,
        entity_id: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        session_id: str,
        *,
        last: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Lock the ``limit`` oldest receivable messages of one session under ``token`` until
        ``locked_until``, counting a delivery; returns the ``returning`` columns of each
        (without a session: ``_receive_batch`` in ``covers.py``)."""
        return await self._fetch_all(
            "UPDATE messages SET state = 'locked', lock_token = %(token)b,"
            " locked_until = %(until)b, delivery_count = delivery_count + 1"
            f" WHERE seq = ANY({ready_seqs(session=True)})"
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
    async def select(
        self,
        entity_id: int,
        where: MessageFilter,
        after_seq: int,
        limit: int,
        newest_first: bool = False,
    ) -> list[int]:
        clauses, params = named_filter(where)
        order = "DESC" if newest_first else "ASC"
        await self._claiming(entity_id)
        # Locked here, so a receiver cannot take them before the task moves or drops them.
        rows = await self._fetch_all(
            "SELECT seq FROM messages WHERE entity_id = %(entity)b AND state != 'locked'"
            f" AND seq > %(after)b{clauses} AND NOT {COVERED} ORDER BY seq {order}"
            " LIMIT %(limit)b FOR UPDATE SKIP LOCKED",
            {"entity": entity_id, "after": after_seq, "limit": limit, **params},
        )
        return [row[0] for row in rows]

    async def count_matching(
        self, entity_id: int, where: MessageFilter, aggregated: bool = False
    ) -> int:
        clauses, params = named_filter(where)
        kept = await self._kept_count(entity_id, where) if aggregated else None
        named = {"entity": entity_id, **params}
        if kept is not None:  # less the locked ones and the covered, each by the state index
            ((locked,),) = await self._fetch_all(
                "SELECT (SELECT count(*) FROM messages WHERE entity_id = %(entity)b"
                f" AND state = 'locked'{clauses}) + (SELECT count(*) FROM messages"
                " WHERE entity_id = %(entity)b AND state IN ('active', 'dead_lettered')"
                f" AND leasable = 1 AND seq <= {TOP}{clauses})",
                named,
            )
            return kept - int(locked)
        ((n,),) = await self._fetch_all(
            "SELECT count(*) FROM messages WHERE entity_id = %(entity)b AND state != 'locked'"
            f" AND NOT {COVERED}{clauses}",
            named,
        )
        return int(n)
