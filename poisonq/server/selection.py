"""The dead-letter filters of a UI page: as typed (what links, chips and hidden fields carry,
so a page reached by a link shows what was typed) and as the broker takes them.

Times are typed as a browser's ``datetime-local`` field sends them (``2026-11-24T18:05``,
seconds optional) and read as UTC, as every time on the pages is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from poisonq.client import spelled_filters
from poisonq.errors import InvalidOptionError

FILTERS = (
    "reason",
    "subject",
    "fingerprint",
    "message_id",
    "body_contains",
    "min_sequence",
    "max_sequence",
    "since",
    "until",
)


@dataclass(frozen=True, slots=True)
class Selection:
    given: dict[str, str]  # the filters typed (empty fields are not filters), as typed
    where: dict[str, Any]  # the same as keyword arguments of the broker's filters


def selection(params: dict[str, str]) -> Selection:
    """The filters in ``params``; :class:`InvalidOptionError` for one that does not parse
    (``none`` as a reason, subject or fingerprint selects the messages without one, as the
    ``(none)`` group's link does)."""
    given = {name: params[name].strip() for name in FILTERS if params.get(name, "").strip()}
    where: dict[str, Any] = {}
    for name, value in given.items():
        if name in ("min_sequence", "max_sequence"):
            try:
                where[name] = int(value)
            except ValueError:
                raise InvalidOptionError(f"{name} must be a whole number") from None
        elif name in ("since", "until"):
            where[name] = _utc(name, value)
        else:
            where[name] = value
    return Selection(given, spelled_filters(where))


def _utc(name: str, value: str) -> float:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidOptionError(
            f"{name} must be a time such as 2026-11-24T18:05 (UTC), not {value!r}"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
