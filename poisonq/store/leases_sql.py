"""Leases in both stores: the row each lease keeps (its number, token, range and plans), and
what it holds, by its cover and message by message.

A lease locks the fresh part of its batch as one range (its *cover*): the ready messages in
it that are still leasable (never back in the queue since they were sent) are held by the
lease, under its token and its lock time, with one delivery more than their rows say, and
nothing is written per message. The rest of the batch (messages that came back after an
abandon, a lock expiry, a move) is locked row by row under the same token, as a receiver
locks. So taking and renewing a lease is one row's write; settling a message apart from its
batch writes that message (and counts its delivery in its row); completing the batch deletes
the rows it holds.

Every ready, leasable message at or below the top of its entity's covers lies in exactly one
cover (a lease's cover begins above the covers before it, and a message that comes back to
ready stops being leasable), so the top is all a statement that changes rows needs to ask
(:func:`covered`). Readers see a covered message as locked through the ``held_messages`` view.

How a lease takes its batch is each store's own ``lock_lease``: SQLite runs one writer at a
time; PostgreSQL keeps whatever could claim a message out while a cover is taken
(``postgres/covers.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from poisonq.model import Lease, MessageState
from poisonq.store.shared_sql import SharedStatements

# The ready states: a queue's messages are active, a dead-letter queue's dead-lettered.
_READY = "state IN ('active', 'dead_lettered')"
# The messages a cover holds, among those a statement names.
_IN_COVERS = f"leasable = 1 AND {_READY}"
_LEASE_COLUMNS = (
    "seq, message_id, body, content_type, subject, properties, session_id, correlation_id,"
    " enqueued_at"
)


def covered(entity: str) -> str:
    """Whether a row of ``messages`` is held by a lease's cover range (a boolean expression):
    it is ready, leasable, and at or below the top of the cover ranges of ``entity`` (its
    entity: an expression)."""
    return (
        f"({_IN_COVERS} AND seq <= coalesce((SELECT max(cover_hi) FROM leases"
        f" WHERE leases.entity_id = {entity}), 0))"
    )


def as_covered(columns: str, locked: str, token: str, until: str) -> str:
    """A message's ``columns`` (as the stores' message columns list them) as a cover holds
    it: in state ``locked`` under the cover's ``token`` until ``until`` (each an expression of
    the store's dialect), with the delivery the cover counts."""
    return (
        columns.replace(" state,", f" {locked},")
        .replace(" delivery_count,", " delivery_count + 1,")
        .replace(" lock_token, locked_until,", f" {token}, {until},")
    )


def held_by(entity: str, token: str, now: str) -> str:
    """Whether a row of ``messages`` of ``entity`` is held under the lock token ``token``
    with its lock valid at ``now`` (all three expressions): locked by it, or held by the
    cover of the lease or receive that has that token (a boolean expression)."""
    cover = (
        f"(SELECT cover_{{end}} FROM leases WHERE entity_id = {entity} AND lock_token = {token}"
        f" AND cover_lo IS NOT NULL AND locked_until > {now})"
    )
    return (
        f"((state = 'locked' AND lock_token = {token} AND locked_until > {now})"
        f" OR ({_IN_COVERS} AND seq BETWEEN {cover.format(end='lo')}"
        f" AND {cover.format(end='hi')}))"
    )


def within(cover: tuple[int, int] | None, lo: int, hi: int) -> tuple[int, int] | None:
    """The part of ``[lo, hi]`` that ``cover`` spans, if any."""
    if cover is None or max(lo, cover[0]) > min(hi, cover[1]):
        return None
    return max(lo, cover[0]), min(hi, cover[1])


class LeaseStatements(SharedStatements):
    """The lease methods of both stores' transactions."""

    # What a read of named covered messages that a settlement then acts on adds, to keep them
    # as they are until it does (PostgreSQL's FOR UPDATE; SQLite runs one writer at a time).
    # A read of a lease's range never pins: that would write every row it holds.
    _PIN = ""

    async def _changing_covers(self, entity_id: int) -> None:
        """Called before a change of the entity's covers that decides what others may
        claim (a store whose transactions run side by side keeps them out meanwhile)."""

    async def _give_back_covered(
        self, entity_id: int, token: str, lo: int, hi: int, seqs: Sequence[int] | None, now: float
    ) -> list[int]:
        """Release what the lease with ``token`` holds by its cover in ``[lo, hi]`` (and in
        ``seqs``, if given), no delivery counted; returns those messages. The whole top
        cover given back: its messages are the freshest in the queue, so forgetting the
        cover returns them as they were. Any other part leaves the cover as a message that
        came back does: unleasable, received and leased row by row."""
        cover = await self._cover(entity_id, token, now)
        if cover is None:
            return []
        whole = seqs is None and lo <= cover[0] and cover[1] <= hi
        if whole:
            await self._changing_covers(entity_id)
        covered = await self._in_cover(entity_id, cover, seqs, lo, hi, pin=seqs is not None)
        if whole and cover[1] == await self.cover_top(entity_id):
            await self._forget_cover(entity_id, token)
        elif covered:
            await self._execute(
                f"UPDATE messages SET leasable = 0 WHERE seq {self._in_list('seqs')}"
                f" AND {_IN_COVERS}",
                {"seqs": self._list(covered)},
            )
        return covered

    async def _insert_lease(self, entity_id: int, lease: Lease, **columns: Any) -> None:
        """Record ``lease``, with the store's own ``columns`` (names are ours, never user
        input)."""
        values = {
            "entity_id": entity_id,
            "consumer": lease.consumer,
            "number": lease.number,
            "lock_token": lease.lock_token,
            "count": lease.count,
            "min_seq": lease.min_sequence,
            "max_seq": lease.max_sequence,
            "created_at": lease.created_at,
            **columns,
        }
        await self._execute(
            f"INSERT INTO leases ({', '.join(values)})"
            f" VALUES ({', '.join(':' + name for name in values)})",
            values,
        )

    async def lease(
        self, entity_id: int, name: str, consumer: str, number: int | None
    ) -> Lease | None:
        # The cast gives PostgreSQL the type of a NULL number.
        rows = await self._query(
            "SELECT consumer, number, lock_token, count, min_seq, max_seq, created_at,"
            " completed_at FROM leases WHERE entity_id = :entity AND consumer = :consumer"
            " AND (CAST(:number AS bigint) IS NULL OR number = :number)"
            " ORDER BY number DESC LIMIT 1",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return Lease(name, *rows[0]) if rows else None

    async def finish_lease(self, entity_id: int, consumer: str, number: int, now: float) -> None:
        await self._execute(
            "UPDATE leases SET completed_at = :now WHERE entity_id = :entity"
            " AND consumer = :consumer AND number = :number",
            {"now": now, "entity": entity_id, "consumer": consumer, "number": number},
        )

    async def plan_lease(self, entity_id: int, consumer: str, number: int) -> int:
        rows = await self._query(
            "UPDATE leases SET planned = planned + 1 WHERE entity_id = :entity"
            " AND consumer = :consumer AND number = :number RETURNING planned",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return int(rows[0][0]) if rows else 0

    async def lease_plans(self, entity_id: int, consumer: str, number: int) -> int:
        rows = await self._query(
            "SELECT planned FROM leases WHERE entity_id = :entity AND consumer = :consumer"
            " AND number = :number",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )
        return int(rows[0][0]) if rows else 0

    async def reset_lease_plans(self, entity_id: int, consumer: str, number: int) -> None:
        await self._execute(
            "UPDATE leases SET planned = 0 WHERE entity_id = :entity AND consumer = :consumer"
            " AND number = :number",
            {"entity": entity_id, "consumer": consumer, "number": number},
        )

    async def renew_lease(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, locked_until: float
    ) -> int:
        renewed = await self._update(
            "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
            " AND state = 'locked' AND lock_token = :token AND locked_until > :now"
            " AND seq BETWEEN :lo AND :hi",
            {
                "until": locked_until,
                "entity": entity_id,
                "token": token,
                "now": now,
                "lo": lo,
                "hi": hi,
            },
        )
        cover = await self._cover(entity_id, token, now)
        if cover is None:
            return renewed
        await self._execute(
            "UPDATE leases SET locked_until = :until WHERE entity_id = :entity"
            " AND lock_token = :token",
            {"until": locked_until, "entity": entity_id, "token": token},
        )
        return renewed + await self._count_covered(entity_id, *cover)

    async def revive_lease(
        self, entity_id: int, token: str, lo: int, hi: int, locked_until: float
    ) -> int:
        # As renew_lease, whether or not the locks ran out.
        revived = await self._update(
            "UPDATE messages SET locked_until = :until WHERE entity_id = :entity"
            " AND state = 'locked' AND lock_token = :token AND seq BETWEEN :lo AND :hi",
            {"until": locked_until, "entity": entity_id, "token": token, "lo": lo, "hi": hi},
        )
        rows = await self._query(
            "UPDATE leases SET locked_until = :until WHERE entity_id = :entity"
            " AND lock_token = :token AND cover_lo IS NOT NULL RETURNING cover_lo, cover_hi",
            {"until": locked_until, "entity": entity_id, "token": token},
        )
        if not rows:
            return revived
        return revived + await self._count_covered(
            entity_id, max(lo, rows[0][0]), min(hi, rows[0][1])
        )

    async def _count_covered(self, entity_id: int, lo: int, hi: int) -> int:
        """How many messages in ``[lo, hi]``, a part of one cover, it holds."""
        ((count,),) = await self._query(
            f"SELECT count(*) FROM messages WHERE entity_id = :entity AND {_IN_COVERS}"
            " AND seq BETWEEN :lo AND :hi",
            {"entity": entity_id, "lo": lo, "hi": hi},
        )
        return int(count)

    async def close_expired_leases(self, entity_id: int, now: float) -> None:
        # A receive's cover (of no consumer) is nothing once closed: its row goes.
        params = {"entity": entity_id, "now": now}
        await self._execute(
            "DELETE FROM leases WHERE entity_id = :entity AND consumer = ''"
            " AND cover_lo IS NOT NULL AND locked_until <= :now",
            params,
        )
        await self._execute(
            "UPDATE leases SET cover_lo = NULL, cover_hi = NULL WHERE entity_id = :entity"
            " AND cover_lo IS NOT NULL AND locked_until <= :now",
            params,
        )

    async def cover_top(self, entity_id: int) -> int:
        """The highest sequence number any lease of the entity covers (0: none)."""
        ((top,),) = await self._query(
            "SELECT coalesce(max(cover_hi), 0) FROM leases WHERE entity_id = :entity"
            " AND cover_lo IS NOT NULL",
            {"entity": entity_id},
        )
        return int(top)

    async def _cover(self, entity_id: int, token: str, now: float) -> tuple[int, int] | None:
        """The cover range of the lease with ``token``, if it has one and its lock holds."""
        rows = await self._query(
            "SELECT cover_lo, cover_hi FROM leases WHERE entity_id = :entity"
            " AND lock_token = :token AND cover_lo IS NOT NULL AND locked_until > :now",
            {"entity": entity_id, "token": token, "now": now},
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def _forget_cover(self, entity_id: int, token: str) -> None:
        """The lease with ``token`` holds nothing more by its cover."""
        await self._execute(
            "UPDATE leases SET cover_lo = NULL, cover_hi = NULL WHERE entity_id = :entity"
            " AND lock_token = :token",
            {"entity": entity_id, "token": token},
        )

    async def _covered_of(
        self, entity_id: int, token: str, seqs: Sequence[int], now: float
    ) -> list[int]:
        """Those of ``seqs`` (some) that the lease with ``token`` validly holds by its cover,
        ascending: a settlement's messages that no lock of their own held, kept as they are
        for it."""
        cover = await self._cover(entity_id, token, now)
        return await self._in_cover(entity_id, cover, seqs, min(seqs), max(seqs), pin=True)

    async def _in_cover(
        self,
        entity_id: int,
        cover: tuple[int, int] | None,
        seqs: Sequence[int] | None,
        lo: int,
        hi: int,
        *,
        pin: bool = False,
    ) -> list[int]:
        """The messages in ``[lo, hi]`` (and in ``seqs``, if given) that ``cover`` holds
        (with ``pin``, kept as they are for this transaction: see :attr:`_PIN`)."""
        span = within(cover, lo, hi)
        if span is None:
            return []
        # Listed, they are found by sequence number (+entity_id keeps the planner off the
        # entity's index, which would walk the whole range); else the range is walked.
        which = "entity_id" if seqs is None else f"seq {self._in_list('seqs')} AND +entity_id"
        rows = await self._query(
            f"SELECT seq FROM messages WHERE {which} = :entity AND {_IN_COVERS}"
            f" AND seq BETWEEN :lo AND :hi ORDER BY seq{self._PIN if pin else ''}",
            {
                "seqs": None if seqs is None else self._list(seqs),
                "entity": entity_id,
                "lo": span[0],
                "hi": span[1],
            },
        )
        return [row[0] for row in rows]

    async def delete_leases(self, entity_id: int, consumer: str, before: int) -> None:
        # A lease that still covers messages stays until it is completed or its lock runs
        # out and is closed: without it they would be held by nothing.
        await self._execute(
            "DELETE FROM leases WHERE entity_id = :entity AND consumer = :consumer"
            " AND number < :before AND cover_lo IS NULL",
            {"entity": entity_id, "consumer": consumer, "before": before},
        )

    async def lease_seqs(
        self, entity_id: int, token: str, lo: int, hi: int, now: float, first_delivery: bool = False
    ) -> list[int]:
        rows = await self._query(
            "SELECT seq FROM messages WHERE entity_id = :entity AND state = 'locked'"
            " AND seq BETWEEN :lo AND :hi AND lock_token = :token AND locked_until > :now"
            " AND (NOT :first OR delivery_count = 1)",
            {
                "entity": entity_id,
                "lo": lo,
                "hi": hi,
                "token": token,
                "now": now,
                "first": first_delivery,
            },
        )
        locked = [row[0] for row in rows]
        if first_delivery:  # a covered message is on its first delivery if its row has none
            span = within(await self._cover(entity_id, token, now), lo, hi)
            covered = [] if span is None else await self._first_covered(entity_id, *span)
        else:
            covered = await self._in_cover(
                entity_id, await self._cover(entity_id, token, now), None, lo, hi
            )
        return sorted(locked + covered)

    async def _first_covered(self, entity_id: int, lo: int, hi: int) -> list[int]:
        rows = await self._query(
            f"SELECT seq FROM messages WHERE entity_id = :entity AND {_IN_COVERS}"
            " AND seq BETWEEN :lo AND :hi AND delivery_count = 0",
            {"entity": entity_id, "lo": lo, "hi": hi},
        )
        return [row[0] for row in rows]

    async def lease_rows(
        self, entity_id: int, token: str, lo: int, hi: int, now: float
    ) -> list[tuple[Any, ...]]:
        rows = await self._query(
            f"SELECT {_LEASE_COLUMNS}, delivery_count FROM messages WHERE entity_id = :entity"
            " AND state = 'locked' AND seq BETWEEN :lo AND :hi AND lock_token = :token"
            " AND locked_until > :now ORDER BY seq",
            {"entity": entity_id, "lo": lo, "hi": hi, "token": token, "now": now},
        )
        span = within(await self._cover(entity_id, token, now), lo, hi)
        if span is None:
            return rows
        # Sorted here: ORDER BY made SQLite sort the rows, bodies and all, in a temporary
        # B-tree (they come in order, or nearly, and sorting them here costs little).
        covered = await self._query(
            f"SELECT {_LEASE_COLUMNS}, delivery_count + 1 FROM messages"
            f" WHERE entity_id = :entity AND {_IN_COVERS} AND seq BETWEEN :lo AND :hi",
            {"entity": entity_id, "lo": span[0], "hi": span[1]},
        )
        return sorted(rows + covered, key=_first)

    async def retake(
        self, entity_id: int, token: str, seqs: Sequence[int], ready: MessageState
    ) -> list[tuple[Any, ...]]:
        rows = await self._query(
            "UPDATE messages SET state = 'locked', lock_token = :token,"
            " delivery_count = delivery_count + 1, locked_until = (SELECT locked_until"
            " FROM leases WHERE entity_id = :entity AND lock_token = :token)"
            f" WHERE entity_id = :entity AND state = :ready AND seq {self._in_list('seqs')}"
            f" RETURNING {_LEASE_COLUMNS}, delivery_count",
            {"entity": entity_id, "token": token, "ready": ready, "seqs": self._list(seqs)},
        )
        return sorted(rows, key=_first)


def _first(row: tuple[Any, ...]) -> Any:
    return row[0]
