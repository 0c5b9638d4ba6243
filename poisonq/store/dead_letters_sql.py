"""Dead-letter analysis in both stores: the groups of a dead-letter queue (by reason, subject
or fingerprint), the causes a reason hides, and the error type that names a fingerprint, for
the explorer, ``/metrics`` and the command line.

A dead-letter queue's are read from its kept aggregates (schema 12, ``dead_letter_counts``:
the held messages counted by reason, subject, fingerprint, error type and hour, kept by
triggers in the transaction that moves a message), so they cost what the groups number, not
the messages. Any other entity's are counted from its messages. A group's first and last
times are the earliest and latest of its aggregates' rows: exact as messages arrive, and after
some leave, within the hour of the rows that still hold messages. :meth:`dead_letter_drift`
recounts them for the audit.
"""

from __future__ import annotations

from dataclasses import replace

from poisonq.store.base import NO_VALUE, DeadLetterCause, DeadLetterGroup, MessageFilter
from poisonq.store.history import key_text, key_value
from poisonq.store.rows import GROUP_KEYS
from poisonq.store.shared_sql import SharedStatements

_KEYS = "reason, subject, fingerprint, error_type, bucket"
# Which message column each key of the aggregates is.
_COLUMNS = {
    "reason": "dead_letter_reason",
    "subject": "subject",
    "fingerprint": "last_fingerprint",
    "error_type": "last_error_type",
}
# The dead-letter queues, as the triggers of schema 12 name them.
_DEAD_LETTER_QUEUES = "e.subqueue IN ('deadletter', 'transfer_deadletter')"


def _in_order(groups: list[DeadLetterGroup]) -> list[DeadLetterGroup]:
    """The largest group first; among equals, the one without a key, then by key."""
    return sorted(groups, key=lambda g: (-g.count, g.key is not None, g.key or ""))


class DeadLetterAnalysis(SharedStatements):
    """The dead-letter analysis methods of both stores' transactions."""

    # How each dialect writes a key of the aggregates (the JSON text of a column) and the
    # start of the hour of a time: what the triggers of schema 12 write.
    _KEY: str
    _HOUR: str

    async def dead_letter_groups(
        self, entity_id: int, by: str, aggregated: bool = True
    ) -> list[DeadLetterGroup]:
        if not aggregated:
            return await self._counted_groups(entity_id, by)
        label = "CASE WHEN error_type <> 'null' THEN error_type END" if by == "fingerprint" else by
        if by not in GROUP_KEYS:  # a column name of ours, never user text
            raise ValueError(f"no groups by {by!r}")
        rows = await self._query(
            f"SELECT {by}, max({label}), CAST(sum(count) AS bigint), min(first_at), max(last_at)"
            " FROM dead_letter_counts WHERE entity_id = :entity"
            f" GROUP BY {by} HAVING sum(count) <> 0",
            {"entity": entity_id},
        )
        return _in_order(
            [
                DeadLetterGroup(key_value(k), key_value(text) if text else None, n, first, last)
                for k, text, n, first, last in rows
            ]
        )

    async def _counted_groups(self, entity_id: int, by: str) -> list[DeadLetterGroup]:
        key, label = GROUP_KEYS[by]  # column names, never user text
        rows = await self._query(
            f"SELECT {key}, max({label}), count(*),"
            " min(coalesce(dead_lettered_at, enqueued_at)),"
            " max(coalesce(dead_lettered_at, enqueued_at))"
            f" FROM messages WHERE entity_id = :entity GROUP BY {key}",
            {"entity": entity_id},
        )
        return _in_order([DeadLetterGroup(*row) for row in rows])

    async def dead_letter_causes(
        self, entity_id: int, aggregated: bool = True
    ) -> list[DeadLetterCause]:
        if not aggregated:
            rows = await self._query(
                "SELECT dead_letter_reason, last_error_type, count(*), min(seq) FROM messages"
                " WHERE entity_id = :entity GROUP BY dead_letter_reason, last_error_type",
                {"entity": entity_id},
            )
            causes = [DeadLetterCause(*row) for row in rows]
        else:
            counted = await self._query(
                "SELECT reason, error_type, CAST(sum(count) AS bigint) FROM dead_letter_counts"
                " WHERE entity_id = :entity GROUP BY reason, error_type HAVING sum(count) <> 0",
                {"entity": entity_id},
            )
            causes = [
                DeadLetterCause(
                    reason, error_type, n, await self._sample(entity_id, reason, error_type)
                )
                for reason, error_type, n in (
                    (key_value(r), key_value(t), n) for r, t, n in counted
                )
            ]
        return sorted(
            causes,
            key=lambda c: (
                c.reason is not None,
                c.reason or "",
                -c.count,
                c.error_type is not None,
                c.error_type or "",
            ),
        )

    async def _sample(self, entity_id: int, reason: str | None, error_type: str | None) -> int:
        """The lowest sequence number of a cause: a walk of the reason's index in order to
        the first message of the type."""
        test = "dead_letter_reason IS NULL" if reason is None else "dead_letter_reason = :reason"
        typed = "last_error_type IS NULL" if error_type is None else "last_error_type = :type"
        ((seq,),) = await self._query(
            f"SELECT min(seq) FROM messages WHERE entity_id = :entity AND {test} AND {typed}",
            {"entity": entity_id, "reason": reason, "type": error_type},
        )
        return int(seq)

    async def _kept_count(self, entity_id: int, where: MessageFilter) -> int | None:
        """How many messages of the dead-letter queue ``entity_id`` the aggregates count for
        ``where`` (locked or not), or ``None`` when ``where`` names more than their keys."""
        if replace(where, reason=None, subject=None, fingerprint=None) != MessageFilter():
            return None
        keys = {"reason": where.reason, "subject": where.subject, "fingerprint": where.fingerprint}
        named = {
            k: key_text(None if v is NO_VALUE else v) for k, v in keys.items() if v is not None
        }
        test = "".join(f" AND {k} = :{k}" for k in named)  # names of ours, never user text
        ((count,),) = await self._query(
            "SELECT CAST(coalesce(sum(count), 0) AS bigint) FROM dead_letter_counts"
            f" WHERE entity_id = :entity{test}",
            {"entity": entity_id, **named},
        )
        return int(count)

    async def fingerprint_labels(self, entity_id: int) -> dict[str, tuple[str | None, str | None]]:
        """Every fingerprint a dead-letter queue has held since it was created (or since
        schema 12), with the error type and a description of its first dead letter: what
        names it after its messages left."""
        rows = await self._query(
            "SELECT fingerprint, error_type, description FROM dead_letter_fingerprints"
            " WHERE entity_id = :entity",
            {"entity": entity_id},
        )
        return {str(key_value(print_)): (kind, text) for print_, kind, text in rows}

    async def dead_letter_drift(self) -> set[int]:
        """The dead-letter queues whose aggregates differ from a recount of their messages
        (by count; the first and last times are not recounted, see the module)."""
        keys = ", ".join(self._KEY.format(column=_COLUMNS[k]) for k in _COLUMNS)
        hour = self._HOUR.format(time="coalesce(m.dead_lettered_at, m.enqueued_at)")
        recount = (
            f"SELECT m.entity_id, {keys}, {hour}, count(*) FROM messages m"
            f" JOIN entities e ON e.id = m.entity_id WHERE {_DEAD_LETTER_QUEUES}"
            " GROUP BY 1, 2, 3, 4, 5, 6"
        )
        kept = (
            f"SELECT entity_id, {_KEYS}, CAST(sum(count) AS bigint) FROM dead_letter_counts"
            f" GROUP BY entity_id, {_KEYS} HAVING sum(count) <> 0"
        )
        rows = await self._query(
            f"SELECT entity_id FROM ({kept} EXCEPT {recount}) AS extra"
            f" UNION SELECT entity_id FROM ({recount} EXCEPT {kept}) AS missing",
            {},
        )
        return {row[0] for row in rows}
