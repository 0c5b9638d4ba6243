-- poisonq schema 1: entities with their ledger, messages and their bodies, duplicate-detection
-- ids, tasks.
-- Times are seconds since the epoch (REAL). Values of the CHECK constraints mirror the StrEnums
-- in poisonq/model.py; tests/test_schema.py proves they agree.

CREATE TABLE entities (
    id              INTEGER PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    parent_id       INTEGER REFERENCES entities(id) ON DELETE CASCADE,
    subqueue        TEXT CHECK (subqueue IN ('deadletter', 'retry', 'transfer_deadletter')),
    status          TEXT NOT NULL DEFAULT 'active'
                    CHECK (status IN ('active', 'disabled', 'send_disabled', 'receive_disabled')),
    status_cause    TEXT,
    options         TEXT NOT NULL,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    -- The ledger: sent + moved_in = completed + dropped + moved_out + held, always.
    sent            INTEGER NOT NULL DEFAULT 0,
    moved_in        INTEGER NOT NULL DEFAULT 0,
    completed       INTEGER NOT NULL DEFAULT 0,
    dropped         INTEGER NOT NULL DEFAULT 0,
    moved_out       INTEGER NOT NULL DEFAULT 0,
    dead_lettered   INTEGER NOT NULL DEFAULT 0,
    resubmitted     INTEGER NOT NULL DEFAULT 0,
    lock_expiries   INTEGER NOT NULL DEFAULT 0,
    size_bytes      INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE messages (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id           INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    state               TEXT NOT NULL CHECK (state IN ('scheduled', 'active', 'locked',
                        'deferred', 'dead_lettered', 'completed', 'dropped')),
    message_id          TEXT NOT NULL,
    body_id             INTEGER NOT NULL,
    size                INTEGER NOT NULL,
    content_type        TEXT,
    subject             TEXT,
    properties          TEXT,
    session_id          TEXT,
    correlation_id      TEXT,
    reply_to            TEXT,
    enqueued_at         REAL NOT NULL,
    scheduled_at        REAL,
    visible_at          REAL,
    expires_at          REAL,
    delivery_count      INTEGER NOT NULL DEFAULT 0,
    abort_count         INTEGER NOT NULL DEFAULT 0,
    move_count          INTEGER NOT NULL DEFAULT 0,
    resubmit_count      INTEGER NOT NULL DEFAULT 0,
    hop_count           INTEGER NOT NULL DEFAULT 0,
    lock_token          TEXT,
    locked_until        REAL,
    dead_letter_reason  TEXT,
    dead_letter_description TEXT,
    dead_letter_source  TEXT,
    dead_lettered_at    REAL,
    last_error_type     TEXT,
    last_fingerprint    TEXT,
    failures            TEXT
) STRICT;

-- Receive (FIFO among active), lock-expiry sweeps and listings all walk this index.
CREATE INDEX messages_by_state ON messages (entity_id, state, seq);
CREATE INDEX messages_scheduled ON messages (entity_id, visible_at) WHERE state = 'scheduled';
CREATE INDEX messages_expiring ON messages (entity_id, expires_at) WHERE expires_at IS NOT NULL;

-- Bodies are immutable and kept apart from the message rows, which change on every lock and
-- settlement: SQLite (like PostgreSQL) rewrites a whole row on update, and the body is most
-- of it. Each body belongs to exactly one message row; the store deletes it with the row.
CREATE TABLE bodies (
    id          INTEGER PRIMARY KEY,
    body        BLOB NOT NULL
) STRICT;

CREATE TABLE seen_message_ids (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    message_id  TEXT NOT NULL,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (entity_id, message_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE tasks (
    id          INTEGER PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('resubmit', 'purge')),
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    status      TEXT NOT NULL CHECK (status IN ('running', 'completed', 'cancelled', 'failed')),
    spec        TEXT NOT NULL,
    total       INTEGER NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    error       TEXT
) STRICT;
