"""Which messages a call selects: the filter keyword arguments of ``peek``, the dead-letter
reads, ``resubmit`` and ``purge``, checked once here and turned into a
:class:`~poisonq.store.base.MessageFilter`; and the groupings of a dead-letter queue."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from poisonq.engine.targets import check_text
from poisonq.errors import InvalidOptionError
from poisonq.limits import check_count
from poisonq.model import to_timestamp
from poisonq.store.base import NO_VALUE, MessageFilter, NoValue

VALUE_FILTERS = ("reason", "subject", "fingerprint")


NO_VALUE_LABEL = "(none)"


def group_label(key: str | None) -> str:
    """How tables, charts and messages name a dead-letter group: its key; the group of the
    messages without a value ``(none)``, told apart from an empty value, shown ``""``."""
    if key is None:
        return NO_VALUE_LABEL
    return key or '""'


def grouping_for(where: dict[str, Any]) -> str:
    """The grouping that shows what a selection missed: the first value filter it has,
    else the reason (a resubmit or purge that selects nothing shows the groups there are)."""
    return next((name for name in VALUE_FILTERS if name in where), "reason")


def spelled_filters(where: Mapping[str, Any]) -> dict[str, Any]:
    """Filter keyword arguments as the command line, the HTTP API and the web UI spell them:
    ``none`` as a reason, subject or fingerprint is :data:`NO_VALUE` (the messages without
    one)."""
    spelling = str(NO_VALUE)
    return {
        name: NO_VALUE if name in VALUE_FILTERS and value == spelling else value
        for name, value in where.items()
    }


def message_filter(where: dict[str, Any]) -> MessageFilter:
    """A message filter from keyword arguments, refusing unknown names and values of the
    wrong kind (a task records its filter, and a store compares them with its columns)."""
    try:
        wanted = MessageFilter(**where)
    except TypeError:
        known = ", ".join(MessageFilter.__dataclass_fields__)
        raise InvalidOptionError(f"unknown filter in {sorted(where)}; use {known}") from None
    for name in (*VALUE_FILTERS, "session_id"):
        value = getattr(wanted, name)
        if not isinstance(value, NoValue) or name == "session_id":
            check_text(value, name)
    for name in ("min_sequence", "max_sequence"):
        if getattr(wanted, name) is not None:
            check_count(getattr(wanted, name), name, minimum=0)
    since, until = (None if t is None else to_timestamp(t) for t in (wanted.since, wanted.until))
    # A range that is empty by construction is a typo, not a search: say so rather than
    # answer "no messages" (``until`` is exclusive).
    if since is not None and until is not None and until <= since:
        raise InvalidOptionError("until must be later than since (the range is empty)")
    low, high = wanted.min_sequence, wanted.max_sequence
    if low is not None and high is not None and high < low:
        raise InvalidOptionError("max_sequence must not be below min_sequence")
    return dataclasses.replace(wanted, since=since, until=until)


def check_grouping(by: str) -> None:
    if by not in VALUE_FILTERS:
        raise InvalidOptionError(f"group by reason, subject or fingerprint, not {by!r}")
