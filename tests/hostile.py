"""Hostile input for the property-based tests of every public surface (``test_hostile_*``):
hypothesis strategies for what a careless or malicious caller passes, and the rule each call
must keep.

The rule: a call either works or raises a :class:`poisonq.PoisonqError` (never a driver's
error, nor a ``TypeError`` from deep inside, nor a :class:`poisonq.StoreError`: nothing here
makes the store fail, so one would be the database refusing what the caller gave it), a
refused call changes nothing, and after every call the ledger balances.

The settings match the state machine's (random examples, hypothesis' example database) with
few examples, so that the hostile tests add seconds, not minutes, to ``make test``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from poisonq import Broker, PoisonqError, StoreError
from tests.helpers import assert_balanced

HOSTILE = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""Per test: one broker (per store) for every example, which is the point: what one
hostile call leaves behind must not break the next."""

# Text a name, an id or a value may be: any code point, lone surrogates included.
any_char = st.characters(exclude_categories=())
SPECIAL_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "orders/$deadletterqueue",
    "orders;poison",
    "orders;retry",
    "orders/$transfer/$deadletterqueue",
    "$deadletterqueue",
    "/orders",
    "orders/",
    "a//b",
    "../../etc/passwd",
    "'; DROP TABLE messages; --",
    '" OR 1=1 --',
    "%s %b %(x)s ?",
    "x" * 261,
    "é" * 300,
    "\u202e\ufeff\u200b",
    "a\nb\tc\r",
    "events/subscriptions/audit",
]
hostile_text = st.sampled_from(SPECIAL_TEXT) | st.text(any_char, max_size=300)
# Names that are valid, so that a test also reaches past validation into the store.
valid_names = st.from_regex(r"[A-Za-z0-9._\-]{1,20}", fullmatch=True)
names = hostile_text | valid_names

huge_ints = st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**200, -(2**200)])
ints = st.integers() | huge_ints | st.sampled_from([0, -1, 1])
floats = st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -0.0, 5e-324])
scalars = st.none() | st.booleans() | ints | floats | hostile_text | st.binary(max_size=20)
times = (
    st.datetimes()
    | st.datetimes(timezones=st.just(UTC))
    | st.sampled_from([datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)])
)
durations = ints | floats | st.timedeltas() | st.sampled_from([timedelta.max, True, "5"])
anything: st.SearchStrategy[Any] = st.recursive(
    scalars | times | st.timedeltas() | st.just(object()),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(scalars, inner, max_size=3)
        | st.frozensets(scalars, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=8,
)
sequence_numbers = ints | anything
# Waits that are wrong, or no wait: a valid one would make a receive wait that long for real.
bad_waits = st.sampled_from([None, 0, -1, -1e-9, math.nan, math.inf, 2**70, "5", True]) | (
    st.timedeltas(max_value=timedelta(0))
)


def state(broker: Broker) -> list[tuple[object, ...]]:
    """What a refused call must leave as it was: every entity's counts and ledger."""
    return [(e.name, e.status, e.counts, e.ledger) for e in broker.entities()]


def attempt(broker: Broker, call: Callable[[], object]) -> object:
    """Run ``call`` under the rule (module docstring); returns what it returned, or the
    :class:`PoisonqError` it raised."""
    before = state(broker)
    try:
        result = call()
    except PoisonqError as exc:
        assert not isinstance(exc, StoreError), f"the store failed on bad input: {exc!r}"
        assert state(broker) == before, f"{exc!r} left changes behind"
        assert_balanced(broker)
        return exc
    assert_balanced(broker)
    return result
