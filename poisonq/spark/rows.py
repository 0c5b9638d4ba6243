"""A transform's return values as rows of the output schema, strictly.

A message is completed without an output row only when its transform returned ``None``.
Anything else must become exactly one row, or its message fails with
``OutputSchemaMismatch`` (permanent, so it is dead-lettered) naming the field, the offending
value and the row, with a fingerprint per field and kind of mismatch so that a transform
that gets one field wrong for every message is seen as one group (and as a defect, see
:mod:`poisonq.defects`), not as many poison messages.

- A dict, or a ``Row`` with field names, maps by name and must carry every field of the
  schema; a key the schema does not have is an error unless ``ignore_extra_fields``.
- A tuple, a list or a ``Row`` without names maps by position and must have one value per
  field.
- Values convert as Arrow converts them, except where that would lose information: a
  float with a fractional part for an integer field (Arrow truncates it), ``None`` for a
  ``NOT NULL`` field (Arrow keeps it), and nested structs follow the rules above.
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from types import NoneType
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from poisonq.failures import first_line
from poisonq.limits import MAX_SHOWN_ROW, MAX_SHOWN_VALUE
from poisonq.model import FailureRecord

ERROR_TYPE = "OutputSchemaMismatch"
_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class _Mismatch(Exception):
    """One value that does not fit; ``kind`` groups alike mismatches."""

    def __init__(self, where: str, kind: str, why: str) -> None:
        super().__init__(f"field {where!r}: {why}" if where else why)
        self.where = where
        self.kind = kind


def _shown(value: Any, limit: int = MAX_SHOWN_VALUE) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields_of(value: Any) -> dict[str, Any] | None:
    """A dict or a named ``Row`` as a mapping by name; ``None`` for anything else."""
    if isinstance(value, dict):
        return value
    names = getattr(value, "__fields__", None)
    if isinstance(value, tuple) and names is not None:
        return dict(zip(names, value, strict=True))
    return None


@dataclass(frozen=True)
class OutputSchema:
    """The output schema of a pipeline and how strictly a transform's rows must fit it."""

    struct: StructType
    ignore_extra_fields: bool = False

    @cached_property
    def arrow(self) -> pa.Schema:
        return to_arrow_schema(self.struct)

    @cached_property
    def _names(self) -> tuple[str, ...]:
        return tuple(self.arrow.names)

    @cached_property
    def _keys(self) -> Any:
        """The schema's names as a dict's keys: what a dict output's keys must equal."""
        return dict.fromkeys(self._names).keys()

    def batch(
        self, outputs: Sequence[Any]
    ) -> tuple[pa.RecordBatch, list[tuple[int, FailureRecord]]]:
        """The outputs that fit, as one record batch, and a failure for each that does not,
        with its index in ``outputs``."""
        failed: list[tuple[int, FailureRecord]] = []
        kept: Sequence[int] = range(len(outputs))
        columns = self._named_columns(outputs)
        if columns is None:
            rows: list[tuple[Any, ...]] = []
            kept = []
            for index, output in enumerate(outputs):
                try:
                    rows.append(self._row(output))
                    kept.append(index)
                except _Mismatch as mismatch:
                    failed.append((index, self._failure(mismatch, output)))
            columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in self._names]
        arrays, bad = self._columns(columns)
        if bad:
            for position, wrong in sorted(bad.items()):
                failed.append((kept[position], self._failure(wrong, outputs[kept[position]])))
            # A row dropped for one column was kept in the columns before it.
            good = [i for i in range(len(kept)) if i not in bad]
            arrays, _ = self._columns([[column[i] for i in good] for column in columns])
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow), failed

    def _named_columns(self, outputs: Sequence[Any]) -> list[list[Any]] | None:
        """The columns of the outputs when every one is a dict with exactly the schema's
        keys (the common case), taken apart at C speed; ``None`` otherwise."""
        try:
            if not all(map(self._keys.__eq__, map(dict.keys, outputs))):
                return None
        except TypeError:  # not every output is a dict
            return None
        return [list(map(operator.itemgetter(name), outputs)) for name in self._names]

    def _row(self, output: Any) -> tuple[Any, ...]:
        """The output's values in schema order, or :class:`_Mismatch`."""
        named = _fields_of(output)
        if named is not None:
            return self._by_name(named, "", self.arrow)
        if isinstance(output, (tuple, list)):
            return self._by_position(output, "", self.arrow)
        raise _Mismatch(
            "",
            f"returned:{type(output).__name__}",
            f"the transform returned a {type(output).__name__} ({_shown(output)}); return a"
            " dict, a Row, a tuple or a list of the schema's fields, or None to skip the message",
        )

    def _by_name(
        self, values: dict[str, Any], where: str, fields: pa.Schema | pa.StructType
    ) -> tuple[Any, ...]:
        names = [f.name for f in fields]
        keys = values.keys()
        missing = [name for name in names if name not in keys]
        if missing:
            raise _Mismatch(
                _join(where, missing[0]), "missing", f"missing field(s) {', '.join(missing)}"
            )
        extra = sorted(set(keys) - set(names))
        if extra and not self.ignore_extra_fields:
            raise _Mismatch(
                _join(where, extra[0]),
                "extra",
                f"field(s) {', '.join(extra)} are not in the schema"
                " (ignore_extra_fields=True or --ignore-extra-fields drops them)",
            )
        return tuple(values[name] for name in names)

    def _by_position(
        self, values: Sequence[Any], where: str, fields: pa.Schema | pa.StructType
    ) -> tuple[Any, ...]:
        if len(values) != len(fields):
            raise _Mismatch(
                where,
                "arity",
                f"{len(values)} value(s) for the {len(fields)} field(s)"
                f" {', '.join(f.name for f in fields)}",
            )
        return tuple(values)

    def _columns(self, columns: list[list[Any]]) -> tuple[list[pa.Array], dict[int, _Mismatch]]:
        """The columns in Arrow, and the rows with a value that does not convert (or would
        lose information), by index. A column is converted whole; its values are looked at
        one by one only where Arrow failed or converts loosely. Checked values are left in
        ``columns`` in the form Arrow converts."""
        arrays: list[pa.Array] = []
        bad: dict[int, _Mismatch] = {}
        for field, column in zip(self.arrow, columns, strict=True):
            try:
                array: pa.Array | None = pa.array(column, field.type)
                suspects = _suspects(column, field)
            except _ARROW_ERRORS:
                array, suspects = None, range(len(column))
            for index in suspects:
                try:
                    column[index] = self._check(column[index], field, field.name)
                except _Mismatch as mismatch:
                    bad.setdefault(index, mismatch)
            if array is None or suspects:
                good = [v for i, v in enumerate(column) if i not in bad]
                array = pa.array(good, field.type)
            arrays.append(array)
        return arrays, bad

    def _check(self, value: Any, field: pa.Field, where: str) -> Any:
        """One value against its field, nested fields included; returns it in the form
        Arrow converts (structs as dicts)."""
        kind = field.type
        if value is None:
            if not field.nullable:
                raise _Mismatch(where, "null", "None for a NOT NULL field")
            return None
        if pa.types.is_integer(kind) and isinstance(value, float) and not value.is_integer():
            raise _Mismatch(where, "lossy", f"{value!r} would lose its fraction as {kind}")
        if pa.types.is_struct(kind):
            named = _fields_of(value)
            if named is not None:
                values = self._by_name(named, where, kind)
            elif isinstance(value, (tuple, list)):
                values = self._by_position(value, where, kind)
            else:
                raise _Mismatch(
                    where, f"type:{type(value).__name__}", f"{_shown(value)} is not a struct"
                )
            return {
                child.name: self._check(item, child, _join(where, child.name))
                for child, item in zip(kind, values, strict=True)
            }
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and isinstance(
            value, (list, tuple)
        ):
            return [self._check(item, kind.value_field, f"{where}[]") for item in value]
        if pa.types.is_map(kind) and isinstance(value, dict):
            return {k: self._check(v, kind.item_field, f"{where}{{}}") for k, v in value.items()}
        try:
            pa.array([value], kind)
        except _ARROW_ERRORS as exc:
            first = first_line(exc)
            raise _Mismatch(
                where, f"type:{type(value).__name__}->{kind}", f"{_shown(value)}: {first}"
            ) from None
        return value

    def _failure(self, mismatch: _Mismatch, output: Any) -> FailureRecord:
        key = f"{ERROR_TYPE}|{mismatch.where}|{mismatch.kind}"
        return FailureRecord(
            time=time.time(),
            error_type=ERROR_TYPE,
            message=str(mismatch),
            traceback=(
                f"{ERROR_TYPE}: {mismatch}\n"
                f"the transform returned: {_shown(output, MAX_SHOWN_ROW)}\n"
                f"the output schema is: {self.struct.simpleString()}"
            ),
            fingerprint=hashlib.sha1(key.encode()).hexdigest()[:16],
        )


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _suspects(column: list[Any], field: pa.Field) -> Sequence[int]:
    """Which values of a column Arrow converted need a look of their own. Arrow refuses
    what our rules refuse except that it truncates floats into integers, keeps ``None`` in a
    ``NOT NULL`` field and ignores missing and extra keys of nested structs."""
    if pa.types.is_nested(field.type):
        return range(len(column))
    types = set(map(type, column))  # at C speed; most columns hold one type
    suspects: list[int] = []
    if not field.nullable and NoneType in types:
        suspects += [i for i, v in enumerate(column) if v is None]
    if pa.types.is_integer(field.type) and float in types:
        suspects += [i for i, v in enumerate(column) if type(v) is float]
    return suspects
