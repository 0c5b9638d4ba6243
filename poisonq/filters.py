"""Subscription filters: which messages sent to a topic reach a subscription.

Two kinds, as Service Bus has: a :class:`CorrelationFilter` (every named property equals a
value) and a :class:`SqlFilter`, a small boolean language over message properties::

    region = 'eu' AND (amount >= 100 OR priority IN ('high', 'urgent')) AND NOT test
    sys.subject = 'order' AND coupon IS NULL AND EXISTS(customer)

Comparisons ``= != <> < <= > >=``, ``AND OR NOT``, parentheses, ``IN (...)``, ``IS [NOT]
NULL``, ``EXISTS(name)``, and string ('it''s'), number and TRUE/FALSE/NULL literals. A bare
name is a user property; ``sys.<field>`` is a broker field (``subject``, ``message_id``,
``correlation_id``, ``content_type``, ``session_id``, ``reply_to``, ``to``,
``reply_to_session_id``). The text is parsed once, by a hand-written tokenizer and
recursive-descent parser, into a tree that is evaluated in Python: never ``eval``, never SQL.
Bad text raises :class:`FilterError` when the filter is made; a comparison of incompatible
types (``'a' < 1``) raises :class:`FilterEvaluationError` when a message is evaluated, which
a subscription may turn into a dead-letter.

A subscription holds one filter, or named rules (:class:`RuleSet`, Service Bus' rules on a
subscription: any of them matching lets a message in); its first filter is its rule
``$Default``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from poisonq.errors import FilterError, InvalidOptionError
from poisonq.model import PropertyValue

SYSTEM_FIELDS = (
    "subject",
    "message_id",
    "correlation_id",
    "content_type",
    "session_id",
    "reply_to",
    "to",
    "reply_to_session_id",
)
Values = Mapping[str, PropertyValue]
_MISSING = object()


class FilterEvaluationError(Exception):
    """A filter could not be evaluated on a message (incompatible types)."""


_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+\.\d*|\.\d+|\d+)"
    r"|(?P<string>'(?:[^']|'')*')"
    r"|(?P<op><>|!=|<=|>=|=|<|>|\(|\)|,)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?))"
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "EXISTS"}
MAX_DEPTH = 32
"""How deep parentheses and NOTs may nest: the parser and the tree it builds recurse once per
level, and a filter is evaluated deep in a send's stack."""


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number, string, op, name, keyword, end
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            tokens.append(_Token("end", "", position))
            return tokens
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise FilterError(text, position, f"unexpected character {text[position]!r}")
        kind = match.lastgroup
        assert kind is not None
        word, start = match.group(kind), match.start(kind)
        if kind == "name" and word.upper() in _KEYWORDS:
            kind, word = "keyword", word.upper()
        tokens.append(_Token(kind, word, start))
        position = match.end()


# The tree: each node is a function of the message's values ---------------------------------
Node = Callable[[Values], Any]


def _compare(op: str, left: Any, right: Any) -> bool | None:
    """SQL three-valued comparison: anything compared with NULL is unknown (None)."""
    if left is None or right is None:
        return None
    numeric = (int, float)
    if isinstance(left, bool) != isinstance(right, bool) or (
        isinstance(left, numeric) != isinstance(right, numeric)
    ):
        if op in ("=", "!="):
            return op == "!="
        raise FilterEvaluationError(f"cannot compare {left!r} {op} {right!r}")
    try:
        match op:
            case "=":
                return bool(left == right)
            case "!=":
                return bool(left != right)
            case "<":
                return bool(left < right)
            case "<=":
                return bool(left <= right)
            case ">":
                return bool(left > right)
            case _:
                return bool(left >= right)
    except TypeError:  # values of a type no message property has (a caller's own dict)
        raise FilterEvaluationError(f"cannot compare {left!r} {op} {right!r}") from None


class _Parser:
    """expr := or; or := and (OR and)*; and := not (AND not)*; not := NOT not | predicate;
    predicate := EXISTS ( name ) | ( expr ) | value [op value | [NOT] IN (values) |
    IS [NOT] NULL]."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.depth = 0

    def parse(self) -> Node:
        node = self._or()
        if self._peek().kind != "end":
            self._fail("expected the end of the filter")
        return node

    def _peek(self) -> _Token:
        return self.tokens[self.at]

    def _next(self) -> _Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _accept(self, kind: str, text: str) -> bool:
        token = self._peek()
        if token.kind == kind and token.text == text:
            self.at += 1
            return True
        return False

    def _expect(self, kind: str, text: str) -> None:
        if not self._accept(kind, text):
            self._fail(f"expected {text!r}")

    def _fail(self, why: str) -> None:
        token = self._peek()
        found = token.text or "the end"
        raise FilterError(self.text, token.position, f"{why}, found {found!r}")

    def _or(self) -> Node:
        nodes = [self._and()]
        while self._accept("keyword", "OR"):
            nodes.append(self._and())
        return nodes[0] if len(nodes) == 1 else _chain(nodes, decisive=True)

    def _and(self) -> Node:
        nodes = [self._not()]
        while self._accept("keyword", "AND"):
            nodes.append(self._not())
        return nodes[0] if len(nodes) == 1 else _chain(nodes, decisive=False)

    def _deeper(self) -> None:
        """Enter one more level of parentheses or NOT, refusing more than :data:`MAX_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._fail(f"nested more than {MAX_DEPTH} deep")

    def _not(self) -> Node:
        if self._accept("keyword", "NOT"):
            self._deeper()
            inner = self._not()
            self.depth -= 1
            return lambda values: None if (v := inner(values)) is None else not v
        return self._predicate()

    def _predicate(self) -> Node:
        if self._accept("keyword", "EXISTS"):
            self._expect("op", "(")
            token = self._next()
            if token.kind != "name":
                self.at -= 1
                self._fail("EXISTS takes a property name")
            self._expect("op", ")")
            name = token.text
            return lambda values: _lookup(values, name) is not _MISSING
        if self._accept("op", "("):
            self._deeper()
            node = self._or()
            self._expect("op", ")")
            self.depth -= 1
            return node
        left = self._value()
        token = self._peek()
        if token.kind == "op" and token.text in ("=", "!=", "<>", "<", "<=", ">", ">="):
            self.at += 1
            op = "!=" if token.text == "<>" else token.text
            right = self._value()
            return lambda values: _compare(op, left(values), right(values))
        negate = self._accept("keyword", "NOT")
        if self._accept("keyword", "IN"):
            self._expect("op", "(")
            options = [self._value()]
            while self._accept("op", ","):
                options.append(self._value())
            self._expect("op", ")")
            return _in_node(left, options, negate)
        if not negate and self._accept("keyword", "IS"):
            negate = self._accept("keyword", "NOT")
            self._expect("keyword", "NULL")
            return lambda values: (left(values) is None) != negate
        if negate:
            self._fail("expected IN after NOT")
        # A bare value is a condition: a boolean property or literal.
        return lambda values: _truth(left(values))

    def _value(self) -> Node:
        token = self._next()
        match token.kind:
            case "number":
                number: float | int = float(token.text) if "." in token.text else int(token.text)
                return lambda values: number
            case "string":
                text = token.text[1:-1].replace("''", "'")
                return lambda values: text
            case "keyword" if token.text in ("TRUE", "FALSE", "NULL"):
                literal = {"TRUE": True, "FALSE": False, "NULL": None}[token.text]
                return lambda values: literal
            case "name":
                name = token.text
                if name.startswith("sys.") and name[4:] not in SYSTEM_FIELDS:
                    self.at -= 1
                    self._fail(f"unknown system field; use one of {', '.join(SYSTEM_FIELDS)}")

                def read(values: Values) -> Any:
                    found = _lookup(values, name)
                    return None if found is _MISSING else found

                return read
        self.at -= 1
        self._fail("expected a name or a literal")
        raise AssertionError("unreachable")


def _lookup(values: Values, name: str) -> Any:
    return values.get(name, _MISSING)


def _truth(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise FilterEvaluationError(f"{value!r} is not a condition (TRUE or FALSE)")


def _chain(operands: list[Node], decisive: bool) -> Node:
    """SQL's three-valued AND (``decisive`` False) or OR (True) of a chain, left to right,
    as one node (a chain of nodes would recurse once per operator)."""

    def node(values: Values) -> bool | None:
        unknown = False
        for operand in operands:
            value: bool | None = operand(values)
            if value is decisive:
                return decisive
            unknown = unknown or value is None
        return None if unknown else not decisive

    return node


def _in_node(left: Node, options: list[Node], negate: bool) -> Node:
    def node(values: Values) -> bool | None:
        value = left(values)
        if value is None:
            return None
        found = any(_compare("=", value, option(values)) for option in options)
        return found != negate

    return node


# Filters ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A boolean expression over properties; see the module docstring."""

    expression: str
    _node: Node = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = self.expression
        if not isinstance(text, str):
            raise InvalidOptionError(f"a SQL filter is text, not {text!r}")
        if not text.strip():
            raise FilterError(text, 0, "a SQL filter needs an expression")
        object.__setattr__(self, "_node", _Parser(text).parse())

    def matches(self, values: Values) -> bool:
        """Whether the message matches (unknown, as with NULL, does not)."""
        return self._node(values) is True

    def to_json(self) -> dict[str, Any]:
        return {"sql": self.expression}


@dataclass(frozen=True, slots=True)
class CorrelationFilter:
    """Every given property (or ``sys.`` field) equals its value."""

    properties: dict[str, PropertyValue]

    def __post_init__(self) -> None:
        if not isinstance(self.properties, dict) or not self.properties:
            raise InvalidOptionError("a correlation filter needs at least one property")

    def matches(self, values: Values) -> bool:
        return all(
            _lookup(values, name) == value and _lookup(values, name) is not _MISSING
            for name, value in self.properties.items()
        )

    def to_json(self) -> dict[str, Any]:
        return {"correlation": self.properties}


@dataclass(frozen=True, slots=True)
class TrueFilter:
    """Every message matches (a subscription created without a filter)."""

    def matches(self, values: Values) -> bool:
        return True

    def to_json(self) -> dict[str, Any]:
        return {}


Rule = SqlFilter | CorrelationFilter | TrueFilter
DEFAULT_RULE = "$Default"
"""The name of a subscription's filter as one rule (Service Bus names the rule a
subscription is created with so)."""


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A subscription's named rules, as Service Bus keeps them: a message matches when any
    rule does, and none when there is no rule."""

    rules: tuple[tuple[str, Rule], ...]

    def matches(self, values: Values) -> bool:
        return any(rule.matches(values) for _, rule in self.rules)

    def to_json(self) -> dict[str, Any]:
        return {"rules": [{"name": name, **rule.to_json()} for name, rule in self.rules]}

    @classmethod
    def of(cls, rule: Filter) -> RuleSet:
        """The rules of a subscription's filter: a single filter is its rule ``$Default``."""
        return rule if isinstance(rule, RuleSet) else cls(((DEFAULT_RULE, rule),))


Filter = Rule | RuleSet


def make_filter(spec: Filter | str | Mapping[str, PropertyValue] | None) -> Filter:
    """A filter from a filter object, SQL text, or a dict of properties (correlation)."""
    match spec:
        case None:
            return TrueFilter()
        case SqlFilter() | CorrelationFilter() | TrueFilter() | RuleSet():
            return spec
        case str():
            return SqlFilter(spec)
        case Mapping():
            return CorrelationFilter(dict(spec))
    raise InvalidOptionError(f"a filter is SQL text, a dict of properties or None, not {spec!r}")


def filter_from_json(data: Mapping[str, Any]) -> Filter:
    if "rules" in data:
        return RuleSet(tuple((rule["name"], _rule_from_json(rule)) for rule in data["rules"]))
    return _rule_from_json(data)


def _rule_from_json(data: Mapping[str, Any]) -> Rule:
    if "sql" in data:
        return SqlFilter(data["sql"])
    if "correlation" in data:
        return CorrelationFilter(dict(data["correlation"]))
    return TrueFilter()
