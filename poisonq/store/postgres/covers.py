"""The lease covers in the PostgreSQL store: how a lease takes its batch, and what keeps the
messages a cover holds from anyone else (the covers themselves, and what both stores read of
them, are :mod:`poisonq.store.leases_sql`).

SQLite runs one writer at a time. Here a cover is taken while other transactions run, and it
locks no row, so there is nothing for ``SKIP LOCKED`` to skip. What keeps two holders apart
instead:

- **The entity's cover lock** (a transaction-level advisory lock): every transaction that
  claims ready messages of an entity (a receive, a TTL sweep, a bulk task's selection) or
  adds messages to it holds it shared, taken in a statement of its own so that the
  statements after it see every cover committed before; a lease takes it exclusive before
  it reads its batch, so it waits for the claims and sends under way, and those after it
  wait for its commit and then see its cover. A message sent while a cover is taken thus
  gets a sequence number above it, never one inside it (a cover is a range: a message
  committed inside it later would be completed with the batch, unread).
- **Who takes it exclusive, and when.** A lease waits for it, from its transaction's first
  claim on (its TTL sweep) rather than shared first: two transactions holding it shared
  and each then asking for it exclusive would wait for each other. A receive only tries
  for it, in the statement before its last (:meth:`PostgresCovers._receive_batch`): got, it
  takes its batch as a cover recorded in a row of ``leases`` of no consumer; not got, it
  holds the lock shared and locks its batch row by row. Nothing of a transaction holding
  the lock exclusive may wait for a row lock, which one waiting for the lock shared could
  hold (its settlement's, its lock sweep's): so the receive's try comes last, and a sweep
  of expired covers closes only the covers it swept.
- **A message that comes back to ready is never leasable again** (an abandon, a release, a
  lock expiry, a move, a promotion): its row is written then anyway, and no cover taken
  meanwhile can count it as its own. Such messages are leased row by row.
- **What a settlement reads of a cover it keeps as it is** (``FOR UPDATE``,
  :attr:`PostgresCovers._PIN`), as :meth:`locked` does a message's own lock; the sweep of an
  expired cover takes the lease row (``SKIP LOCKED``: another sweep has it) and waits for
  its messages, so a message settled apart meanwhile is found changed and left alone.
"""

from __future__ import annotations

from typing import Any

from poisonq.model import Lease, MessageState
from poisonq.store.leases_sql import LeaseStatements, covered
from poisonq.store.postgres.runner import StatementRunner

# The key space of poisonq's advisory locks (the first of their two keys), apart from any
# the application may take on the same database.
COVER_LOCKS = 0x706F6971
SESSION_PICKS = COVER_LOCKS + 1  # a session a look for the next free one is taking

# The top of the entity's cover ranges (0: none), for statements binding ``entity``.
TOP = (
    "(SELECT coalesce(max(cover_hi), 0) FROM leases WHERE entity_id = %(entity)b"
    " AND cover_lo IS NOT NULL)"
)
# Whether a row of ``messages`` of the entity bound as ``entity`` is held by a cover.
COVERED = covered("%(entity)b")
# What a message's delivery count is short of by its cover (it is one more than its row's).
COVER_DELIVERY = f"({COVERED})::int"

# The entity's ready messages in the order of messages_by_state (see batches.in_index_order):
# the fresh ones above the covers, and (by messages_unleasable) those that came back below.
_FRESH = (
    "WHERE (entity_id, state, seq) > (%(entity)b, %(ready)b, {top})"
    f" AND (entity_id, state, seq) < (%(entity)b, %(ready)b, {2**63 - 1})"
    " ORDER BY entity_id, state, seq LIMIT %(limit)b"
).format(top=TOP)
_CAME_BACK = (
    "WHERE leasable = 0 AND (entity_id, state, seq) > (%(entity)b, %(ready)b, 0)"
    f" AND (entity_id, state, seq) <= (%(entity)b, %(ready)b, {TOP})"
    " ORDER BY entity_id, state, seq LIMIT %(limit)b"
)


def receivable(columns: str, lock: str = "") -> str:
    """The ``limit`` oldest receivable messages of ``entity`` in state ``ready`` (``columns``
    of each), each part locked with ``lock`` (``FOR UPDATE SKIP LOCKED``: a part may lock up
    to ``limit`` it does not return, until the transaction ends)."""
    return (
        f"SELECT {columns} FROM (SELECT {columns} FROM messages {_FRESH}{lock}) AS fresh"
        f" UNION ALL SELECT {columns} FROM (SELECT {columns} FROM messages {_CAME_BACK}{lock})"
        f" AS came_back ORDER BY seq LIMIT %(limit)b"
    )


# A lease's batch: how many fresh messages (the cover) and their range, and the sequence
# numbers of those that came back, which the lease locks row by row.
_BATCH = (
    "SELECT count(*) FILTER (WHERE leasable = 1), min(seq) FILTER (WHERE leasable = 1),"
    " max(seq) FILTER (WHERE leasable = 1), array_agg(seq) FILTER (WHERE leasable = 0)"
    f" FROM ({receivable('seq, leasable')}) AS batch"
)
# Whether the receive's try of the cover lock (see PostgresCovers._receive_batch) got it.
_RANGED = "(SELECT current_setting('poisonq.cover', true) = %(entity)b::text)"
# A receive's batch, in one statement that takes the path its try of the cover lock decided
# (``{columns}``: the message columns a receive returns; ``{fresh}``: the same, as a cover
# holds them). With the lock, as a lease takes its batch: the fresh messages as a cover, one
# row of ``leases`` of no consumer, the others locked row by row; first it forgets the
# receives' covers of the entity that hold nothing any more (settled, or closed by a lock
# sweep): a cover row lives as long as a message in its range is held by it. One that a
# lock sweep has is left for later (SKIP LOCKED): that sweep may wait for the cover lock.
# Without the lock, every message locked row by row, SKIP LOCKED. The branch not taken
# runs nothing: its subqueries are gated by the try's answer (a one-time filter, an array
# under CASE). The batch's messages are named by sequence number (+entity_id keeps the
# planner off the entity's index, which it would walk and AND with the primary key's
# look-up when its statistics are stale: a queue drained since the last ANALYZE).
_RECEIVE_BATCH = (
    f"WITH batch AS MATERIALIZED (SELECT seq, leasable FROM ({receivable('seq, leasable')})"
    f" AS b WHERE {_RANGED}), forgotten AS (DELETE FROM leases"
    " WHERE (entity_id, consumer, number) IN (SELECT entity_id, consumer, number FROM leases l"
    f" WHERE {_RANGED} AND entity_id = %(entity)b AND consumer = '' AND (cover_lo IS NULL"
    " OR NOT EXISTS (SELECT FROM messages m WHERE m.entity_id = %(entity)b"
    " AND m.state IN ('active', 'dead_lettered') AND m.leasable = 1"
    " AND m.seq BETWEEN l.cover_lo AND l.cover_hi)) FOR UPDATE SKIP LOCKED)),"
    " cover AS (INSERT INTO leases (entity_id, consumer, number, lock_token, count, min_seq,"
    " max_seq, created_at, locked_until, cover_lo, cover_hi) SELECT %(entity)b, '', min(seq),"
    " %(token)b, count(*), min(seq), max(seq), %(until)b, %(until)b, min(seq), max(seq)"
    " FROM batch WHERE leasable = 1 HAVING count(*) > 0),"
    " came_back AS (UPDATE messages SET state = 'locked', lock_token = %(token)b,"
    " locked_until = %(until)b, delivery_count = delivery_count + 1"
    " WHERE seq = ANY(ARRAY(SELECT seq FROM batch WHERE leasable = 0))"
    " AND +entity_id = %(entity)b AND state = %(ready)b RETURNING {columns}),"
    " locked AS (UPDATE messages SET state = 'locked', lock_token = %(token)b,"
    " locked_until = %(until)b, delivery_count = delivery_count + 1"
    f" WHERE seq = ANY(CASE WHEN NOT {_RANGED} THEN"
    f" ARRAY({receivable('seq', ' FOR UPDATE SKIP LOCKED')}) END) RETURNING {{columns}})"
    " SELECT {columns} FROM came_back UNION ALL SELECT {columns} FROM locked"
    " UNION ALL SELECT {fresh} FROM messages"
    " WHERE seq = ANY(ARRAY(SELECT seq FROM batch WHERE leasable = 1))"
    " AND +entity_id = %(entity)b"
)


def emptied(settled: str) -> str:
    """A ``WITH`` item that forgets the receive's cover of the token bound as ``token`` when
    the messages ``settled`` (a ``WITH`` item of the statement returning ``seq``) are all it
    held: the cover counted them as it was taken (``count``), and inside its range every
    message the token holds is a covered one (those it locked row by row came back from
    below the range). Settled in parts, it is forgotten by a later receive
    (:data:`_RECEIVE_BATCH`). One a lock sweep has is left (SKIP LOCKED): waiting for it, a
    settlement would hold its messages, which the sweep waits for."""
    return (
        "emptied AS (DELETE FROM leases WHERE (entity_id, consumer, number) IN"
        " (SELECT entity_id, consumer, number FROM leases WHERE entity_id = %(entity)b"
        " AND consumer = '' AND lock_token = %(token)b AND cover_lo IS NOT NULL"
        f" AND count = (SELECT count(*) FROM {settled} WHERE seq BETWEEN cover_lo AND cover_hi)"
        " FOR UPDATE SKIP LOCKED))"
    )


_LOCK_CAME_BACK = (
    "UPDATE messages SET state = 'locked', lock_token = %(token)b, locked_until = %(until)b,"
    " delivery_count = delivery_count + 1 WHERE seq = ANY(%(seqs)b) AND entity_id = %(entity)b"
    " AND state = %(ready)b RETURNING seq"
)


class PostgresCovers(LeaseStatements, StatementRunner):
    """How :class:`~poisonq.store.postgres.transaction.PostgresTransaction` takes and keeps
    its covers."""

    _PIN = " FOR UPDATE"

    async def _claiming(self, entity_id: int) -> None:
        """Hold the entity's cover lock shared: this transaction claims or adds messages of
        it (see the module docstring). The statements after this one see its covers. A
        transaction that will take a lease of the entity takes it exclusive at once: held
        shared and then asked for exclusive, two such transactions would wait for each
        other."""
        if entity_id in self._leasing:
            await self._changing_covers(entity_id)
        elif entity_id not in self._cover_locks:
            self._cover_locks.add(entity_id)
            await self._run(
                "SELECT pg_advisory_xact_lock_shared(%b, %b)",
                (COVER_LOCKS, entity_id & 0x7FFFFFFF),
            )

    async def lease_follows(self, entity_id: int) -> None:
        self._leasing.add(entity_id)

    async def _receive_batch(
        self,
        columns: str,
        fresh: str,
        entity_id: int,
        ready: MessageState,
        limit: int,
        token: str,
        locked_until: float,
        *,
        last: bool,
    ) -> list[tuple[Any, ...]]:
        """Lock the ``limit`` oldest receivable messages of the entity under ``token`` until
        ``locked_until``, counting a delivery; returns the ``columns`` of each (``fresh``:
        those columns as a cover holds them).

        The receive tries the cover lock exclusive, and keeps the answer in the transaction
        for its last statement (no round trip): got, it takes its batch as a lease does
        (:data:`_RECEIVE_BATCH`); else it holds the lock shared (waiting for a lease or
        receive that holds it) and locks row by row. Only tried, and only just before the
        receive's last statement: a transaction holding the lock exclusive must wait for
        no row lock that one waiting for it shared could hold (its settlement's, its lock
        sweep's)."""
        key = (COVER_LOCKS, entity_id & 0x7FFFFFFF)
        await self._run(
            "SELECT set_config('poisonq.cover', CASE WHEN pg_try_advisory_xact_lock(%b, %b)"
            " THEN %b::text ELSE '' END, true)",
            (*key, entity_id),
        )
        await self._claiming(entity_id)  # (granted at once if the try got it exclusive)
        return await self._fetch_all(
            _RECEIVE_BATCH.format(columns=columns, fresh=fresh),
            {
                "entity": entity_id,
                "ready": ready.value,
                "limit": limit,
                "token": token,
                "until": locked_until,
            },
            last=last,
        )

    async def _changing_covers(self, entity_id: int) -> None:
        """Hold the entity's cover lock exclusive: this transaction takes or gives back a
        cover that decides what other transactions may claim."""
        if entity_id not in self._exclusive:
            await self._run(
                "SELECT pg_advisory_xact_lock(%b, %b)", (COVER_LOCKS, entity_id & 0x7FFFFFFF)
            )
            self._cover_locks.add(entity_id)
            self._exclusive.add(entity_id)

    async def lock_lease(
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
        await self._changing_covers(entity_id)
        params = {"entity": entity_id, "ready": ready.value, "limit": limit}
        ((fresh, cover_lo, cover_hi, came_back),) = await self._fetch_all(_BATCH, params)
        locked: list[int] = []
        if came_back:  # (the fresh ones nobody else can claim now: they need no lock)
            rows = await self._fetch_all(
                _LOCK_CAME_BACK,
                {**params, "seqs": came_back, "token": token, "until": locked_until},
            )
            locked = [row[0] for row in rows]
        held = locked + ([cover_lo, cover_hi] if fresh else [])
        if not held:
            return None
        count, first, last = fresh + len(locked), min(held), max(held)
        lease = Lease(name, consumer, number, token, count, first, last, now)
        await self._insert_lease(
            entity_id, lease, locked_until=locked_until, cover_lo=cover_lo, cover_hi=cover_hi
        )
        return lease
