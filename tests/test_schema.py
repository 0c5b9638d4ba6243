"""The schema of both stores: CHECK constraints match the enums, migrations are versioned and
an older store is upgraded in place; store URLs are checked."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import poisonq
from poisonq.errors import SchemaVersionError
from poisonq.model import EntityStatus, MessageState, SubQueue
from poisonq.store.sqlite import SqliteStore
from tests.helpers import execute_behind_the_back, script_versions


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
    versions = db.execute("SELECT version FROM poisonq_schema ORDER BY version").fetchall()
    assert versions == [(v,) for v in script_versions("sqlite")]


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


@pytest.mark.parametrize(
    "url", ["sqlite:/x.db", "sqlite//x.db", "sqlite:x.db", "postgres:/host/db", "http://x"]
)
def test_a_malformed_url_is_refused_and_creates_nothing(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(poisonq.InvalidOptionError) as refused:
        poisonq.connect(url)
    assert "sqlite:///relative/path.db, sqlite:////absolute/path.db" in str(refused.value)
    assert "postgresql://user@host/database" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_bare_paths_still_name_sqlite_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for path in ("queues.db", "data/queues.db", str(tmp_path / "abs.db")):
        poisonq.connect(path).close()
    assert {p.name for p in tmp_path.rglob("*.db")} == {"queues.db", "abs.db"}
    assert (tmp_path / "data" / "queues.db").exists()


def test_create_false_refuses_a_missing_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for url, where in (
        ("sqlite:///nope.db", tmp_path / "nope.db"),
        ("nope.db", tmp_path / "nope.db"),
        (f"sqlite:///{tmp_path}/dir/nope.db", tmp_path / "dir" / "nope.db"),
    ):
        with pytest.raises(poisonq.StoreNotFoundError) as missing:
            poisonq.connect(url, create=False)
        assert str(missing.value) == f"no poisonq store at {where}"
        assert missing.value.location == str(where)
    assert list(tmp_path.iterdir()) == []
    poisonq.connect("sqlite:///there.db").close()
    poisonq.connect("sqlite:///there.db", create=False).close()


# Both stores ------------------------------------------------------------------------------------
def _script(kind: str, version: int) -> str:
    folder = resources.files("poisonq.store") / "migrations" / kind
    (script,) = [p for p in folder.iterdir() if p.name.startswith(f"{version:04d}_")]
    return script.read_text()


def test_postgres_check_constraints_match_the_enums(pg_url: str) -> None:
    poisonq.connect(pg_url).close()
    rows = execute_behind_the_back(
        pg_url,
        "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE contype = 'c' AND conrelid::regclass::text IN ('messages', 'entities')",
    )

    def values(table: str, column: str) -> set[str]:
        (ddl,) = [str(d) for t, d in rows if t == table and f"({column} = " in str(d)]
        return set(re.findall(r"'([^']+)'::text", ddl))

    assert values("messages", "state") == {s.value for s in MessageState}
    assert values("entities", "status") == {s.value for s in EntityStatus}
    assert values("entities", "subqueue") == {s.value for s in SubQueue}


def test_the_two_stores_have_the_same_migrations() -> None:
    names = {
        kind: sorted(
            p.name
            for p in (resources.files("poisonq.store") / "migrations" / kind).iterdir()
            if p.name.endswith(".sql")
        )
        for kind in ("sqlite", "postgres")
    }
    assert names["sqlite"] == names["postgres"]


def test_an_older_store_is_upgraded_in_place(url: str) -> None:
    """A file or database at schema version 1 (before leases) keeps its data and gains the
    later migrations when a newer poisonq opens it."""
    kind = "sqlite" if url.startswith("sqlite") else "postgres"
    old = _script(kind, 1) + ";\nCREATE TABLE poisonq_schema (version INTEGER NOT NULL)"
    old += ";\nINSERT INTO poisonq_schema (version) VALUES (1)"
    if kind == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            db.executescript(old)
    else:
        execute_behind_the_back(url, old)
    execute_behind_the_back(
        url,
        "INSERT INTO entities (name, options, created_at, updated_at) VALUES ('kept', '{}', 0, 0)",
    )
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send(poisonq.Message(body=b"x"))
        lease = broker.acquire_lease("orders", "c1", 1, max_messages=10)  # needs schema 2
        assert lease is not None and lease.count == 1
    versions = execute_behind_the_back(url, "SELECT version FROM poisonq_schema ORDER BY version")
    assert versions == [(v,) for v in script_versions(kind)]
    assert execute_behind_the_back(url, "SELECT name FROM entities WHERE name = 'kept'") == [
        ("kept",)
    ]


def test_a_newer_postgres_schema_is_refused(pg_url: str) -> None:
    poisonq.connect(pg_url).close()
    execute_behind_the_back(pg_url, "INSERT INTO poisonq_schema (version) VALUES (999)")
    with pytest.raises(SchemaVersionError, match="999"):
        poisonq.connect(pg_url)


def test_postgres_urls(pg_url: str) -> None:
    with pytest.raises(poisonq.InvalidOptionError, match="no host"):
        poisonq.connect("postgresql:///db")
    with pytest.raises(poisonq.InvalidOptionError, match="pool_size"):
        poisonq.connect(pg_url + "&pool_size=0")
    with pytest.raises(poisonq.InvalidOptionError, match="synchronous_commit"):
        poisonq.connect(pg_url + "&synchronous_commit=maybe")
    with pytest.raises(poisonq.StoreError, match="cannot open PostgreSQL store"):
        poisonq.connect(
            "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2", retry_total=0
        )
    with poisonq.connect(pg_url.replace("postgresql://", "postgres://") + "&pool_size=2") as b:
        b.create_queue("orders")
        assert b.counts("orders")["active"] == 0


def test_a_password_never_shows_in_an_error() -> None:
    with pytest.raises(poisonq.StoreError) as caught:
        poisonq.connect(
            "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2", retry_total=0
        )
    assert "secret" not in str(caught.value) and "***" in str(caught.value)


def test_sqlite_users_do_not_import_psycopg(tmp_path: Path) -> None:
    code = (
        "import sys, poisonq\n"
        f"poisonq.connect('sqlite:///{tmp_path}/q.db').close()\n"
        "assert 'psycopg' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


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
    assert _sqlite_schema(tmp_path / "old.db") == _sqlite_schema(tmp_path / "new.db")
    db = sqlite3.connect(tmp_path / "old.db")
    assert db.execute("SELECT rollbacks FROM entities").fetchall() == [(0,)]


def _sqlite_schema(path: Path) -> list[tuple[str, str]]:
    """Every table, index, view and trigger of a SQLite store, with its definition and
    columns."""
    db = sqlite3.connect(path)
    rows = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"
    ).fetchall()
    return sorted(
        (name, sql + str(db.execute(f"PRAGMA table_info({name})").fetchall())) for name, sql in rows
    )


def test_a_store_of_schema_14_keeps_its_messages_and_bodies_as_one_row_each(
    tmp_path: Path,
) -> None:
    """Schema 15 moves each body into its message's row: a store of schema 14 holding an
    active, a locked, a leased and a dead-lettered message keeps each with its body, state,
    lock and lease, its ledger and dead-letter aggregates balance, no sequence number is
    given twice (the last one sent was completed before the upgrade), and its schema is a
    fresh install's."""
    clock = poisonq.ManualClock()
    now = clock.now()
    fresh = tmp_path / "fresh.db"
    with poisonq.connect(f"sqlite:///{fresh}") as broker:
        broker.create_queue("orders")  # its entity rows, as schema 14 has them too
    old = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    old.execute("CREATE TABLE poisonq_schema (version INTEGER NOT NULL) STRICT")
    for version in range(1, 15):
        old.executescript(_script("sqlite", version))
        old.execute("INSERT INTO poisonq_schema (version) VALUES (?)", (version,))
    old.execute("ATTACH ? AS fresh", (str(fresh),))
    old.execute("INSERT INTO entities SELECT * FROM fresh.entities")
    old.execute("DETACH fresh")
    (queue,) = old.execute("SELECT id FROM entities WHERE name = 'orders'").fetchone()
    (dlq,) = old.execute(
        "SELECT id FROM entities WHERE parent_id = ? AND subqueue = ?", (queue, "deadletter")
    ).fetchone()
    old.executemany(
        "INSERT INTO bodies (id, body) VALUES (?, ?)",
        [(10, b"one"), (11, b"two"), (12, b"three"), (13, b"four")],
    )
    insert = (
        "INSERT INTO messages (seq, entity_id, state, message_id, body_id, size, enqueued_at,"
        " delivery_count, lock_token, locked_until, dead_letter_reason, dead_lettered_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    old.executemany(
        insert,
        [
            (1, queue, "active", "m1", 10, 3, now, 0, None, None, None, None),
            (2, queue, "locked", "m2", 11, 3, now, 1, "token", now + 60, None, None),
            (3, dlq, "dead_lettered", "m3", 12, 5, now, 1, None, None, "Bad", now),
            (4, queue, "active", "m4", 13, 4, now, 0, None, None, None, None),
            (5, queue, "active", "m5", 10, 3, now, 0, None, None, None, None),
        ],
    )
    old.execute("DELETE FROM messages WHERE seq = 5")  # completed: 5 must not come again
    old.execute(
        "INSERT INTO leases (entity_id, consumer, number, lock_token, count, min_seq, max_seq,"
        " created_at, locked_until, cover_lo, cover_hi) VALUES (?, 'spark', 1, 'lease', 1,"
        " 4, 4, ?, ?, 4, 4)",
        (queue, now, now + 60),
    )
    old.execute("UPDATE entities SET sent = 5, completed = 1, moved_out = 1 WHERE id = ?", (queue,))
    old.execute("UPDATE entities SET moved_in = 1 WHERE id = ?", (dlq,))
    old.close()

    with poisonq.connect(f"sqlite:///{tmp_path / 'old.db'}", clock=clock) as broker:
        held = broker.peek("orders", max_messages=10)
        assert [(m.sequence_number, m.body, m.state) for m in held] == [
            (1, b"one", MessageState.ACTIVE),
            (2, b"two", MessageState.LOCKED),
            (4, b"four", MessageState.LOCKED),
        ]
        [dead] = broker.dead_letters("orders")
        assert (dead.body, dead.dead_letter_reason) == (b"three", "Bad")
        assert broker.audit().ok
        lease = broker.acquire_lease("orders", "spark", 1, max_messages=10)
        assert lease is not None and [row[:3] for row in broker.lease_rows(lease)] == [
            (4, "m4", b"four")
        ]
        assert broker.complete_lease(lease) == 1
        [seq] = broker.sender("orders").send(poisonq.Message(body=b"six"))
        assert seq == 6
        receiver = broker.receiver("orders")
        received = receiver.receive(max_messages=10)
        assert [(m.sequence_number, m.body) for m in received] == [(1, b"one"), (6, b"six")]
        receiver.complete(received)
        assert broker.audit().ok
    SqliteStore(tmp_path / "new.db").close()
    assert _sqlite_schema(tmp_path / "old.db") == _sqlite_schema(tmp_path / "new.db")
