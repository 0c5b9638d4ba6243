"""Expectations: named Spark SQL booleans a row must meet, or its message is dead-lettered.

Like a Delta ``CHECK`` constraint, an expectation holds only when it is true: false or NULL
fails it (``amount > 0`` fails a row whose ``amount`` did not parse). The names of the
expectations a row fails travel with the row in one array column, computed by Spark next to
the row itself, so checking costs no extra job; the executor that settles the batch turns a
failing row into a dead-lettering with reason ``ExpectationFailed`` (:mod:`poisonq.spark.gate`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from poisonq.errors import InvalidOptionError
from poisonq.failures import first_line
from poisonq.limits import MAX_MESSAGE, MAX_SHOWN_VALUES
from poisonq.model import DeadLetter, FailureRecord

REASON = "ExpectationFailed"
FAILED = "__poisonq_failed_expectations"


def check_expectations(expectations: Mapping[str, str] | None) -> dict[str, str]:
    """``expectations`` as a dict of name to SQL text, or :class:`InvalidOptionError`."""
    if expectations is None:
        return {}
    if not isinstance(expectations, Mapping):
        raise InvalidOptionError(
            'expectations must be a dict of name to SQL boolean, e.g. {"positive": "amount > 0"}'
        )
    for name, sql in expectations.items():
        if not (isinstance(name, str) and name.strip() and isinstance(sql, str) and sql.strip()):
            raise InvalidOptionError(
                f"expectation {name!r}: {sql!r} must be a name and a SQL boolean, both text"
            )
    return dict(expectations)


def with_failed(frame: DataFrame, expectations: Mapping[str, str]) -> DataFrame:
    """``frame`` with the :data:`FAILED` column: the names of the expectations each row
    fails. An expectation that is not a SQL boolean over ``frame`` is
    :class:`InvalidOptionError`, naming it."""
    for name, sql in expectations.items():
        try:
            kind = frame.select(F.expr(sql)).schema[0].dataType
        except PySparkException as exc:
            first = first_line(exc)
            message = f"expectation {name!r} ({sql}) does not apply: {first}"
            raise InvalidOptionError(message) from None
        if not isinstance(kind, BooleanType):
            raise InvalidOptionError(
                f"expectation {name!r} ({sql}) is a {kind.simpleString()}, not a boolean"
            )
    return frame.withColumn(FAILED, _failed_names(expectations))


def _failed_names(expectations: Mapping[str, str]) -> Column:
    checks = [
        F.when(F.coalesce(F.expr(sql), F.lit(False)), F.lit(None)).otherwise(F.lit(name))
        for name, sql in expectations.items()
    ]
    if not checks:
        return F.array().cast("array<string>")
    return F.filter(F.array(*checks), lambda name: name.isNotNull())


def expectation_dead_letter(
    seq: int, lock_token: str, names: list[str], row: dict[str, Any]
) -> DeadLetter:
    """The dead-lettering of a message whose row failed ``names``; the description names
    them and shows the row's values (truncated)."""
    values = json.dumps(row, default=str, ensure_ascii=False)
    if len(values) > MAX_SHOWN_VALUES:
        values = values[:MAX_SHOWN_VALUES] + "…"
    failed = ", ".join(names)
    description = f"failed expectation{'s' if len(names) > 1 else ''} {failed}; row: {values}"
    failure = FailureRecord(
        time.time(),
        REASON,
        description[:MAX_MESSAGE],
        fingerprint="expectation:" + ",".join(sorted(names)),
    )
    return DeadLetter(seq, lock_token, REASON, description[:MAX_MESSAGE], failure)
