"""The strict conversion of a transform's return values into output rows (no Spark job)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from poisonq.spark.rows import OutputSchema

ITEM = StructType([StructField("sku", StringType()), StructField("qty", IntegerType())])
SCHEMA = StructType(
    [
        StructField("id", LongType(), nullable=False),
        StructField("total", DoubleType()),
        StructField("items", ArrayType(ITEM)),
    ]
)
GOOD = {"id": 1, "total": 2.5, "items": [{"sku": "a", "qty": 1}]}


def convert(*outputs: Any, ignore_extra_fields: bool = False) -> tuple[list[Any], dict[int, Any]]:
    batch, failed = OutputSchema(SCHEMA, ignore_extra_fields).batch(outputs)
    return batch.to_pylist(), dict(failed)


def test_dicts_rows_tuples_and_lists_become_the_same_row() -> None:
    rows, failed = convert(
        GOOD,
        Row(id=1, total=2.5, items=[Row(sku="a", qty=1)]),  # by name
        (1, 2.5, [("a", 1)]),  # by position
        [1, 2.5, [["a", 1]]],
        Row(1, 2.5, [Row("a", 1)]),  # a Row without names: by position
    )
    assert failed == {}
    assert rows == [GOOD] * 5


def test_a_row_that_does_not_fit_fails_with_the_value_and_a_fingerprint() -> None:
    cases = {
        "missing": {"id": 1, "total": 2.5},
        "extra": {**GOOD, "note": "x"},
        "arity": (1, 2.5),
        "returned": "1,2.5",
        "wrong type": {**GOOD, "total": "2.5"},
        "lossy": {**GOOD, "id": 1.5},
        "null": {**GOOD, "id": None},
        "nested missing": {**GOOD, "items": [{"sku": "a"}]},
        "nested extra": {**GOOD, "items": [{"sku": "a", "qty": 1, "colour": "red"}]},
        "too big": {**GOOD, "items": [{"sku": "a", "qty": 2**40}]},
    }
    rows, failed = convert(GOOD, *cases.values())
    assert rows == [GOOD]  # the one good row, nothing filled in or dropped silently
    assert sorted(failed) == list(range(1, len(cases) + 1))
    messages = {name: failed[n].message for n, name in enumerate(cases, start=1)}
    assert "missing field(s) items" in messages["missing"]
    assert "note are not in the schema" in messages["extra"]
    assert "2 value(s) for the 3 field(s)" in messages["arity"]
    assert "returned a str ('1,2.5')" in messages["returned"]
    assert "field 'total'" in messages["wrong type"] and "'2.5'" in messages["wrong type"]
    assert "1.5 would lose its fraction" in messages["lossy"]
    assert "NOT NULL" in messages["null"]
    assert "field 'items[].qty'" in messages["nested missing"]
    assert "colour" in messages["nested extra"]
    assert "field 'items[].qty'" in messages["too big"]
    for failure in failed.values():
        assert failure.error_type == "OutputSchemaMismatch"
        assert len(failure.fingerprint) == 16
        assert "the transform returned:" in failure.traceback


def test_alike_mismatches_share_a_fingerprint_and_others_do_not() -> None:
    _, failed = convert({**GOOD, "total": "1"}, {**GOOD, "total": "2"}, {**GOOD, "id": 1.5})
    assert failed[0].fingerprint == failed[1].fingerprint != failed[2].fingerprint


def test_extra_fields_can_be_ignored_when_the_user_says_so() -> None:
    rows, failed = convert({**GOOD, "note": "x"}, ignore_extra_fields=True)
    assert (rows, failed) == ([GOOD], {})


def test_lossless_conversions_are_kept() -> None:
    rows, failed = convert({"id": 2.0, "total": 3, "items": None})
    assert failed == {}
    assert rows == [{"id": 2, "total": 3.0, "items": None}]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_batches_of_any_size(count: int) -> None:
    rows, failed = convert(*([GOOD] * count))
    assert (len(rows), failed) == (count, {})
