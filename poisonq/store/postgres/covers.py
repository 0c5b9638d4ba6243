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
- **A message that comes back to ready is never leasable again** (an abandon, a release, a
  lock expiry, a move, a promotion): its row is written then anyway, and no cover taken
  meanwhile can count it as its own. Such messages are leased row by row.
- **What a settlement reads of a cover it keeps as it is** (``FOR UPDATE``,
  :attr:`PostgresCovers._PIN`), as :meth:`locked` does a message's own lock; the sweep of an
  expired cover takes the lease row (``SKIP LOCKED``: another sweep has it) and waits for
  its messages, so a message settled apart meanwhile is found changed and left alone.
"""

from __future__ import annotations

from poisonq.model import Lease, MessageState
from poisonq.store.leases_sql import LeaseStatements, covered
from poisonq.store.postgres.runner import StatementRunner

# The key space of poisonq's advisory locks (the first of their two keys), apart from any
# the application may take on the same database.
_COVER_LOCKS = 0x706F6971

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
_LOCK_CAME_BACK = (
    "UPDATE messages SET state = 'locked', lock_token = %(token)b, locked_until = %(until)b,"
    " delivery_count = delivery_count + 1 WHERE seq = ANY(%(seqs)b) AND entity_id = %(entity)b"
    " AND state = %(ready)b RETURNING seq"
)


class PostgresCovers(LeaseStatements, StatementRunner):
    """How :class:`~poisonq.store.postgres.transaction.PostgresTransaction` takes and keeps
    its covers."""

    _PIN = " FOR UPDATE"

    def _claiming(self, entity_id: int) -> None:
        """Hold the entity's cover lock shared: this transaction claims or adds messages of
        it (see the module docstring). The statements after this one see its covers."""
        if entity_id not in self._cover_locks:
            self._cover_locks.add(entity_id)
            self._run(
                "SELECT pg_advisory_xact_lock_shared(%b, %b)",
                (_COVER_LOCKS, entity_id & 0x7FFFFFFF),
            )

    def _changing_covers(self, entity_id: int) -> None:
        """Hold the entity's cover lock exclusive: this transaction takes or gives back a
        cover that decides what other transactions may claim."""
        self._run("SELECT pg_advisory_xact_lock(%b, %b)", (_COVER_LOCKS, entity_id & 0x7FFFFFFF))
        self._cover_locks.add(entity_id)

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
        self._changing_covers(entity_id)
        params = {"entity": entity_id, "ready": ready.value, "limit": limit}
        ((fresh, cover_lo, cover_hi, came_back),) = self._fetch_all(_BATCH, params)
        locked: list[int] = []
        if came_back:  # (the fresh ones nobody else can claim now: they need no lock)
            rows = self._fetch_all(
                _LOCK_CAME_BACK,
                {**params, "seqs": came_back, "token": token, "until": locked_until},
            )
            locked = [row[0] for row in rows]
        held = locked + ([cover_lo, cover_hi] if fresh else [])
        if not held:
            return None
        count, first, last = fresh + len(locked), min(held), max(held)
        lease = Lease(name, consumer, number, token, count, first, last, now)
        self._insert_lease(
            entity_id, lease, locked_until=locked_until, cover_lo=cover_lo, cover_hi=cover_hi
        )
        return lease
