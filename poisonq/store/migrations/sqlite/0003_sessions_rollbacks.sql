-- poisonq schema 3: consecutive rollbacks per entity (Service Broker's auto-disable),
-- deliveries a message had when it was dead-lettered (a dead-letter queue's own retry policy
-- counts only the deliveries made there, as MSMQ counts aborts since the last move), and
-- sessions (a lock on a whole session, and its state).

ALTER TABLE entities ADD COLUMN rollbacks INTEGER NOT NULL DEFAULT 0;

ALTER TABLE messages ADD COLUMN dead_lettered_deliveries INTEGER NOT NULL DEFAULT 0;

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
