-- poisonq schema 3: consecutive rollbacks per entity (Service Broker's auto-disable) and
-- sessions (a lock on a whole session, and its state).

ALTER TABLE entities ADD COLUMN rollbacks INTEGER NOT NULL DEFAULT 0;

CREATE TABLE sessions (
    entity_id       INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    session_id      TEXT NOT NULL,
    lock_token      TEXT,
    locked_until    REAL,
    state           BLOB,
    PRIMARY KEY (entity_id, session_id)
) STRICT;

-- A session receiver reads one session's messages in order.
CREATE INDEX messages_by_session ON messages (entity_id, session_id, state, seq)
    WHERE session_id IS NOT NULL;
