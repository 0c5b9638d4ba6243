"""Statements written once for both stores.

Where the two dialects agree (most statements that are not about locking rows), a store's
method is written once, in a class both transactions inherit, with named parameters
(``:name``, which SQLite reads as they are). Each store runs them through three primitives of
its own: :meth:`SharedStatements._query` (rows), :meth:`SharedStatements._update` (how many
rows changed) and :meth:`SharedStatements._execute` (nothing awaited: PostgreSQL sends it
with the next statement that is). A list is bound the store's way (SQLite has no arrays: a
JSON array it expands), through :meth:`SharedStatements._list` and
:meth:`SharedStatements._in_list`. PostgreSQL's driver spells a parameter ``%(name)b``:
:func:`for_postgres` rewrites a statement once, and the text it rewrites holds no other colon
than a ``::`` cast.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cache
from typing import Any

_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)\b")
_LITERAL = re.compile(r"'(?:[^']|'')*'")

Params = dict[str, Any]

# The schema versions a store applied, one row each (see base.pending_migrations), read and
# added as a store opens; SQLite makes the table STRICT, as all of its tables.
SCHEMA_TABLE = "CREATE TABLE IF NOT EXISTS poisonq_schema (version INTEGER NOT NULL)"
SCHEMA_VERSIONS = "SELECT version FROM poisonq_schema"
ADD_SCHEMA_VERSION = "INSERT INTO poisonq_schema (version) VALUES (:version)"


@cache
def for_postgres(sql: str) -> str:
    """``sql`` with its ``:name`` parameters as psycopg's binary ``%(name)b``. A colon in a
    quoted literal would read as a parameter: such a statement is refused (pass the literal
    as a parameter)."""
    if any(":" in literal for literal in _LITERAL.findall(sql)):
        raise ValueError(f"a colon in a quoted literal of a shared statement: {sql}")
    return _NAMED.sub(r"%(\1)b", sql)


class SharedStatements(ABC):
    """What a store provides to run the statements of :mod:`poisonq.store.shared_sql`."""

    @abstractmethod
    async def _query(self, sql: str, params: Params) -> list[tuple[Any, ...]]:
        """The rows of a statement."""

    @abstractmethod
    async def _update(self, sql: str, params: Params) -> int:
        """How many rows a statement changed."""

    @abstractmethod
    async def _execute(self, sql: str, params: Params) -> None:
        """Run a statement whose result nobody needs (a store may send it later)."""

    @abstractmethod
    def _list(self, values: Sequence[Any]) -> Any:
        """``values`` bound as one parameter, for :meth:`_in_list`."""

    @abstractmethod
    def _in_list(self, name: str) -> str:
        """The test that a value is in the list bound as parameter ``name``: ``IN ...``
        or ``= ANY(...)``."""
