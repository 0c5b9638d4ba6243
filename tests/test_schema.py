"""The schema: its CHECK constraints match the enums, and migrations are versioned."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

import poisonq
from poisonq.errors import SchemaVersionError
from poisonq.model import EntityStatus, MessageState, SubQueue
from poisonq.store.sqlite import SqliteStore


def _check_values(db: sqlite3.Connection, table: str, column: str) -> set[str]:
    (ddl,) = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    match = re.search(rf"{column}\s[^,]*?CHECK \({column} IN \(([^)]*)\)\)", ddl, re.S)
    assert match, f"no CHECK on {table}.{column}"
    return set(re.findall(r"'([^']+)'", match.group(1)))


def test_check_constraints_match_the_enums(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "q.db").close()
    db = sqlite3.connect(tmp_path / "q.db")
    assert _check_values(db, "messages", "state") == {s.value for s in MessageState}
    assert _check_values(db, "entities", "status") == {s.value for s in EntityStatus}
    assert _check_values(db, "entities", "subqueue") == {s.value for s in SubQueue}


def test_the_database_refuses_a_state_outside_the_enum(tmp_path: Path) -> None:
    broker = poisonq.connect(f"sqlite:///{tmp_path / 'q.db'}")
    broker.create_queue("orders")
    broker.sender("orders").send(poisonq.Message(body=b"x"))
    broker.close()
    db = sqlite3.connect(tmp_path / "q.db")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE messages SET state = 'lost'")


def test_reopening_keeps_data_and_schema_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send(poisonq.Message(body=b"x"))
    with poisonq.connect(url) as broker:
        assert broker.counts("orders")["active"] == 1
    db = sqlite3.connect(tmp_path / "q.db")
    assert db.execute("SELECT version FROM poisonq_schema").fetchall() == [(1,), (2,), (3,), (4,)]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "q.db").close()
    db = sqlite3.connect(tmp_path / "q.db")
    db.execute("INSERT INTO poisonq_schema (version) VALUES (999)")
    db.commit()
    db.close()
    with pytest.raises(SchemaVersionError, match="999"):
        SqliteStore(tmp_path / "q.db")


def test_store_urls(tmp_path: Path) -> None:
    with pytest.raises(poisonq.InvalidOptionError, match="no host"):
        poisonq.connect("sqlite://host/x.db")
    with pytest.raises(poisonq.InvalidOptionError, match="scheme"):
        poisonq.connect("redis://localhost")
    with pytest.raises(poisonq.InvalidOptionError, match="synchronous"):
        poisonq.connect(f"sqlite:///{tmp_path}/x.db?synchronous=maybe")
    broker = poisonq.connect(f"sqlite:///{tmp_path}/sub/dir/x.db?synchronous=normal")
    assert (tmp_path / "sub" / "dir" / "x.db").exists()
    broker.close()


def test_a_file_of_schema_2_upgrades_to_the_same_schema_as_a_fresh_install(tmp_path: Path) -> None:
    """Migration 0003 on an old file gives what a fresh install has."""
    from importlib import resources

    old = sqlite3.connect(tmp_path / "old.db")
    folder = resources.files("poisonq.store") / "migrations" / "sqlite"
    old.execute("CREATE TABLE poisonq_schema (version INTEGER NOT NULL) STRICT")
    for version in (1, 2):
        script = next(p for p in folder.iterdir() if p.name.startswith(f"000{version}_"))
        old.executescript(script.read_text())
        old.execute("INSERT INTO poisonq_schema (version) VALUES (?)", (version,))
    old.execute(
        "INSERT INTO entities (name, options, created_at, updated_at) VALUES ('q', '{}', 0, 0)"
    )
    old.commit()
    old.close()
    SqliteStore(tmp_path / "old.db").close()
    SqliteStore(tmp_path / "new.db").close()

    def schema(path: Path) -> list[tuple[str, str]]:
        db = sqlite3.connect(path)
        rows = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"
        ).fetchall()
        columns = [
            (table, str(db.execute(f"PRAGMA table_info({table})").fetchall()))
            for (table, _) in rows
        ]
        return sorted(columns)

    assert schema(tmp_path / "old.db") == schema(tmp_path / "new.db")
    db = sqlite3.connect(tmp_path / "old.db")
    assert db.execute("SELECT rollbacks FROM entities").fetchall() == [(0,)]
