"""Hostile text for the subscription filter language (``poisonq/filters.py``): any text, and
near-valid expressions built from its own tokens, either parse or raise ``FilterError``; a
parsed filter matches or raises ``FilterEvaluationError`` on any properties; and on both
stores a subscription with it takes hostile messages without a database error."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from poisonq import Broker, FilterError, Message, PoisonqError, SqlFilter
from poisonq.filters import SYSTEM_FIELDS, FilterEvaluationError
from tests.hostile import HOSTILE, attempt, hostile_text, scalars

WORDS = [
    *("AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "EXISTS", "and", "Or"),
    *("=", "!=", "<>", "<", "<=", ">", ">=", "(", ")", ",", "(", ")"),
    *("region", "amount", "x_1", "sys.subject", "sys.nope", "sys.", ".5", "1.", "007"),
    *("'eu'", "''", "'it''s'", "'\x00'", "'", '"eu"', "9" * 400, "1e5", "-1", "%s", ";"),
    *(f"sys.{name}" for name in SYSTEM_FIELDS),
]
near_valid = st.lists(st.sampled_from(WORDS) | hostile_text, max_size=30).map(" ".join)
deep = st.integers(1, 3000).flatmap(
    lambda n: st.sampled_from(
        ["(" * n + "a" + ")" * n, "NOT " * n + "a", " OR ".join(["a = 1"] * n), "(" * n]
    )
)
literals = (
    st.text(max_size=10).map(lambda t: "'" + t.replace("'", "''") + "'")
    | st.integers(0, 2**80).map(str)
    | st.floats(0, 1e300).map(lambda f: f"{f:.3f}")
    | st.sampled_from(["TRUE", "FALSE", "NULL", "'\x00'", "'\ud800'", "''''"])
)
operands = st.sampled_from(["region", "amount", "a", *(f"sys.{name}" for name in SYSTEM_FIELDS)])
comparisons = st.builds(
    "{} {} {}{}".format,
    operands,
    st.sampled_from(["=", "!=", "<>", "<", "<=", ">", ">=", "IN (", "NOT IN ("]),
    literals,
    st.just(""),
).map(lambda c: c + ")" if " IN (" in c else c) | operands.map("{} IS NOT NULL".format)
valid_filters = st.lists(comparisons, min_size=1, max_size=5).flatmap(
    lambda parts: st.sampled_from([" AND ", " OR "]).map(lambda joint: joint.join(parts))
)
filter_text = hostile_text | near_valid | deep | valid_filters
values = st.dictionaries(st.sampled_from(["region", "amount", "x_1", "a"]) | hostile_text, scalars)


def parse(text: str) -> SqlFilter | None:
    """The filter ``text`` makes, or None when it is refused with a FilterError."""
    try:
        return SqlFilter(text)
    except FilterError:
        return None


@HOSTILE
@given(text=filter_text, properties=st.lists(values, max_size=3))
def test_filter_text_parses_or_raises_filter_error(
    text: str, properties: list[dict[str, Any]]
) -> None:
    parsed = parse(text)
    for given_values in properties if parsed else []:
        with contextlib.suppress(FilterEvaluationError):
            assert parsed.matches(given_values) in (True, False)  # type: ignore[union-attr]


@HOSTILE
@given(text=valid_filters | filter_text, properties=st.lists(values, min_size=1, max_size=3))
def test_a_parsed_filter_never_raises_a_database_error(
    broker: Broker, text: str, properties: list[dict[str, Any]]
) -> None:
    """The filter is kept in the store and read back for every send to the topic."""
    if parse(text) is None:
        return
    if not any(info.name == "events" for info in broker.list_queues()):
        broker.create_topic("events")
    attempt(broker, lambda: broker.delete_queue("events/subscriptions/hostile"))
    for flag in (False, True):
        created = attempt(
            broker,
            lambda f=flag: broker.create_subscription(  # type: ignore[misc]
                "events", "hostile", filter=text, dead_letter_on_filter_evaluation_exceptions=f
            ),
        )
        if isinstance(created, PoisonqError):
            return
        batch = [Message(body=b"x", properties=p) for p in properties]
        attempt(broker, lambda b=batch: broker.sender("events").send(b))  # type: ignore[misc]
        attempt(broker, lambda: broker.delete_queue("events/subscriptions/hostile"))
