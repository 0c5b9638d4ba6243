"""The rule filters of ``azure.servicebus.management`` (``SqlRuleFilter``,
``CorrelationRuleFilter``, ...) and ``RuleProperties``, and their conversion to and from
poisonq's filters. No I/O: the asyncio flavour shares this module."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from poisonq.filters import CorrelationFilter, Rule, SqlFilter, TrueFilter
from poisonq.model import PropertyValue
from poisonq.servicebus.exceptions import FeatureNotSupportedError
from poisonq.servicebus.management.models import Properties


class SqlRuleFilter:
    """A SQL filter; ``parameters`` (``{"@name": value}``) are put in as literals."""

    def __init__(
        self, sql_expression: str | None = None, parameters: Mapping[str, Any] | None = None
    ) -> None:
        self.sql_expression = sql_expression
        self.parameters = dict(parameters) if parameters else None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sql_expression!r})"


class TrueRuleFilter(SqlRuleFilter):
    def __init__(self) -> None:
        super().__init__("1=1")


class FalseRuleFilter(SqlRuleFilter):
    def __init__(self) -> None:
        super().__init__("1=0")


class SqlRuleAction:
    """A rule's action: refused when given (poisonq's rules filter, they change nothing)."""

    def __init__(
        self, sql_expression: str | None = None, parameters: Mapping[str, Any] | None = None
    ) -> None:
        self.sql_expression = sql_expression
        self.parameters = parameters


# CorrelationRuleFilter's fields, by the broker field they compare.
CORRELATION_FIELDS = {
    "correlation_id": "sys.correlation_id",
    "message_id": "sys.message_id",
    "reply_to": "sys.reply_to",
    "to": "sys.to",
    "reply_to_session_id": "sys.reply_to_session_id",
    "label": "sys.subject",
    "session_id": "sys.session_id",
    "content_type": "sys.content_type",
}


class CorrelationRuleFilter:
    """Every given field and property equals its value."""

    def __init__(
        self,
        *,
        correlation_id: str | None = None,
        message_id: str | None = None,
        to: str | None = None,
        reply_to: str | None = None,
        label: str | None = None,
        session_id: str | None = None,
        reply_to_session_id: str | None = None,
        content_type: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        self.correlation_id = correlation_id
        self.message_id = message_id
        self.to = to
        self.reply_to = reply_to
        self.label = label
        self.session_id = session_id
        self.reply_to_session_id = reply_to_session_id
        self.content_type = content_type
        self.properties = dict(properties) if properties else None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        given = {k: v for k, v in vars(self).items() if v is not None}
        return f"CorrelationRuleFilter({given!r})"


RuleFilter = SqlRuleFilter | CorrelationRuleFilter


class RuleProperties(Properties):
    FIELDS = ("filter", "action", "created_at_utc")


def _literal(value: PropertyValue) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def native_rule(rule_filter: RuleFilter | None, action: SqlRuleAction | None = None) -> Rule:
    """poisonq's filter for a rule's (``None``: every message)."""
    if action is not None:
        raise FeatureNotSupportedError("rule actions (SqlRuleAction)", "a rule only filters here")
    if rule_filter is None or isinstance(rule_filter, TrueRuleFilter):
        return TrueFilter()
    if isinstance(rule_filter, SqlRuleFilter):
        parameters = rule_filter.parameters or {}
        text = re.sub(
            r"@\w+",
            lambda m: _literal(parameters[m[0]]) if m[0] in parameters else m[0],
            rule_filter.sql_expression or "",
        )
        return SqlFilter(text)
    if isinstance(rule_filter, CorrelationRuleFilter):
        wanted: dict[str, PropertyValue] = {
            field: getattr(rule_filter, name)
            for name, field in CORRELATION_FIELDS.items()
            if getattr(rule_filter, name) is not None
        }
        return CorrelationFilter({**wanted, **(rule_filter.properties or {})})
    raise TypeError(
        f"a rule's filter is a SqlRuleFilter or a CorrelationRuleFilter, not {rule_filter!r}"
    )


def rule_filter(rule: Rule) -> RuleFilter:
    """The SDK's filter for poisonq's."""
    if isinstance(rule, TrueFilter):
        return TrueRuleFilter()
    if isinstance(rule, SqlFilter):
        if rule.expression.replace(" ", "") == "1=0":
            return FalseRuleFilter()
        return SqlRuleFilter(rule.expression)
    fields = {sys: name for name, sys in CORRELATION_FIELDS.items()}
    given = {fields[k]: v for k, v in rule.properties.items() if k in fields}
    properties = {k: v for k, v in rule.properties.items() if k not in fields}
    return CorrelationRuleFilter(**given, properties=properties or None)  # type: ignore[arg-type]
