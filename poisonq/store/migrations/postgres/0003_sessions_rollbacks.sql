-- poisonq schema 3 (PostgreSQL): consecutive rollbacks per entity (Service Broker's
-- auto-disable), deliveries a message had when it was dead-lettered (a dead-letter queue's own
-- retry policy counts only the deliveries made there, as MSMQ counts aborts since the last
-- move), and sessions (a lock on a whole session, and its state). Mirrors the SQLite script
-- of the same number.

ALTER TABLE entities ADD COLUMN rollbacks bigint NOT NULL DEFAULT 0;

ALTER TABLE messages ADD COLUMN dead_lettered_deliveries integer NOT NULL DEFAULT 0;

CREATE TABLE sessions (
    entity_id       bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    session_id      text NOT NULL,
    lock_token      text,
    locked_until    double precision,
    state           bytea,
    PRIMARY KEY (entity_id, session_id)
);

-- A session receiver reads one session's messages in order.
CREATE INDEX messages_by_session ON messages (entity_id, session_id, state, seq)
    WHERE session_id IS NOT NULL;
