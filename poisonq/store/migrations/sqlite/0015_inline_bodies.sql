-- poisonq schema 15: a message is one row, its body inline. Bodies were kept in a table of
-- their own so that a lock or a settlement would not rewrite them; but then every message cost
-- two rows to send and two to complete. A lock or a move now rewrites the body with its row,
-- which costs less than the second row did. The body is the last column, so the columns
-- before it are read without it.
-- The table is rebuilt (SQLite cannot drop a NOT NULL column or reorder them): messages keep
-- their sequence numbers and bodies (one whose body row is missing, which no version of the
-- store leaves, is kept with an empty body rather than lost to the ledger), and the
-- AUTOINCREMENT counter keeps its top, so no number is ever given twice. The indexes, the
-- aggregates' triggers (schema 12) and the readers' view (schema 13) are made again, the view
-- with the body in place of its id. PostgreSQL kept its bodies inline from the start: its
-- script 15 is empty.
-- Messages no longer carry a foreign key to their entity (PostgreSQL dropped its key in
-- schema 5): the key was checked for every message inserted or moved, a probe of the
-- entities for each row. The store deletes an entity's messages itself, in the transaction
-- that deletes the entity; nothing else deletes an entity.
DROP VIEW held_messages;
CREATE TABLE messages_inline (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id           INTEGER NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('scheduled', 'active', 'locked',
                        'deferred', 'dead_lettered', 'completed', 'dropped')),
    message_id          TEXT NOT NULL,
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
    failures            TEXT,
    dead_lettered_deliveries INTEGER NOT NULL DEFAULT 0,
    leasable            INTEGER NOT NULL DEFAULT 1,
    to_address          TEXT,
    reply_to_session_id TEXT,
    partition_key       TEXT,
    body                BLOB NOT NULL
) STRICT;
INSERT INTO messages_inline (seq, entity_id, state, message_id, size, content_type, subject,
    properties, session_id, correlation_id, reply_to, enqueued_at, scheduled_at, visible_at,
    expires_at, delivery_count, abort_count, move_count, resubmit_count, hop_count, lock_token,
    locked_until, dead_letter_reason, dead_letter_description, dead_letter_source,
    dead_lettered_at, last_error_type, last_fingerprint, failures, dead_lettered_deliveries,
    leasable, to_address, reply_to_session_id, partition_key, body)
SELECT m.seq, m.entity_id, m.state, m.message_id, m.size, m.content_type, m.subject,
    m.properties, m.session_id, m.correlation_id, m.reply_to, m.enqueued_at, m.scheduled_at,
    m.visible_at, m.expires_at, m.delivery_count, m.abort_count, m.move_count,
    m.resubmit_count, m.hop_count, m.lock_token, m.locked_until, m.dead_letter_reason,
    m.dead_letter_description, m.dead_letter_source, m.dead_lettered_at, m.last_error_type,
    m.last_fingerprint, m.failures, m.dead_lettered_deliveries, m.leasable, m.to_address,
    m.reply_to_session_id, m.partition_key, coalesce(b.body, x'')
FROM messages m LEFT JOIN bodies b ON b.id = m.body_id ORDER BY m.seq;
-- The copy set the counter to the highest number held; the old one may be higher (messages
-- completed since): the higher of the two is kept.
UPDATE sqlite_sequence SET seq = max(seq,
    coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0))
WHERE name = 'messages_inline';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'messages_inline', seq FROM sqlite_sequence WHERE name = 'messages'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'messages_inline');
DROP TABLE messages;
DROP TABLE bodies;
ALTER TABLE messages_inline RENAME TO messages;
CREATE INDEX messages_by_state ON messages (entity_id, state, seq);
CREATE INDEX messages_scheduled ON messages (entity_id, visible_at) WHERE state = 'scheduled';
CREATE INDEX messages_expiring ON messages (entity_id, expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX messages_by_session ON messages (entity_id, session_id, state, seq)
    WHERE session_id IS NOT NULL;
CREATE INDEX messages_unleasable ON messages (entity_id, state, seq) WHERE leasable = 0;
CREATE INDEX messages_by_dead_letter_reason ON messages (entity_id, dead_letter_reason, seq)
    WHERE dead_letter_reason IS NOT NULL;
CREATE INDEX messages_by_fingerprint ON messages (entity_id, last_fingerprint, seq)
    WHERE last_fingerprint IS NOT NULL;
-- The aggregates' triggers of schema 12, but for the one of a deletion: a row trigger makes
-- SQLite read every deleted row whole (now with its body) and run the trigger for it, which
-- cost a completion about two thirds of its time. The store counts what it deletes from a
-- dead-letter queue out of the aggregates itself, in the statement's transaction (every
-- deletion of messages goes through one method, SqliteTransaction._delete). The trigger of
-- an update is split in two.
CREATE TRIGGER dead_letter_aggregates_insert AFTER INSERT ON messages
WHEN (SELECT subqueue FROM entities WHERE id = NEW.entity_id)
    IN ('deadletter', 'transfer_deadletter')
BEGIN
    INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type,
        bucket, count, first_at, last_at)
    VALUES (NEW.entity_id, json_quote(NEW.dead_letter_reason), json_quote(NEW.subject),
        json_quote(NEW.last_fingerprint), json_quote(NEW.last_error_type),
        CAST(coalesce(NEW.dead_lettered_at, NEW.enqueued_at) / 3600 AS INTEGER) * 3600, 1,
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at),
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at))
    ON CONFLICT DO UPDATE SET count = count + 1, first_at = min(first_at, excluded.first_at),
        last_at = max(last_at, excluded.last_at);
    INSERT INTO dead_letter_fingerprints (entity_id, fingerprint, error_type, description)
    SELECT NEW.entity_id, json_quote(NEW.last_fingerprint), NEW.last_error_type,
        json_extract(NEW.failures, '$[#-1].message') WHERE NEW.last_fingerprint IS NOT NULL
    ON CONFLICT DO NOTHING;
END;
-- A move between entities, or a change of a key (an abandon in a dead-letter queue records
-- a failure, and with it a new fingerprint): into the new group, out of the old one. Two
-- triggers, each asking only of its own side whether it is a dead-letter queue, so that a
-- message dead-lettered out of a queue runs only the statements that count it in (schema 12
-- ran all four for every row it moved). Which fires first changes no count.
CREATE TRIGGER dead_letter_aggregates_enter
AFTER UPDATE OF entity_id, dead_letter_reason, subject, last_fingerprint, last_error_type,
    dead_lettered_at ON messages
WHEN (OLD.entity_id IS NOT NEW.entity_id OR OLD.dead_letter_reason IS NOT NEW.dead_letter_reason
        OR OLD.subject IS NOT NEW.subject OR OLD.last_fingerprint IS NOT NEW.last_fingerprint
        OR OLD.last_error_type IS NOT NEW.last_error_type
        OR OLD.dead_lettered_at IS NOT NEW.dead_lettered_at)
    AND (SELECT subqueue FROM entities WHERE id = NEW.entity_id)
        IN ('deadletter', 'transfer_deadletter')
BEGIN
    INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type,
        bucket, count, first_at, last_at)
    VALUES (NEW.entity_id, json_quote(NEW.dead_letter_reason), json_quote(NEW.subject),
        json_quote(NEW.last_fingerprint), json_quote(NEW.last_error_type),
        CAST(coalesce(NEW.dead_lettered_at, NEW.enqueued_at) / 3600 AS INTEGER) * 3600, 1,
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at),
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at))
    ON CONFLICT DO UPDATE SET count = count + 1, first_at = min(first_at, excluded.first_at),
        last_at = max(last_at, excluded.last_at);
    INSERT INTO dead_letter_fingerprints (entity_id, fingerprint, error_type, description)
    SELECT NEW.entity_id, json_quote(NEW.last_fingerprint), NEW.last_error_type,
        json_extract(NEW.failures, '$[#-1].message') WHERE NEW.last_fingerprint IS NOT NULL
    ON CONFLICT DO NOTHING;
END;
CREATE TRIGGER dead_letter_aggregates_leave
AFTER UPDATE OF entity_id, dead_letter_reason, subject, last_fingerprint, last_error_type,
    dead_lettered_at ON messages
WHEN (OLD.entity_id IS NOT NEW.entity_id OR OLD.dead_letter_reason IS NOT NEW.dead_letter_reason
        OR OLD.subject IS NOT NEW.subject OR OLD.last_fingerprint IS NOT NEW.last_fingerprint
        OR OLD.last_error_type IS NOT NEW.last_error_type
        OR OLD.dead_lettered_at IS NOT NEW.dead_lettered_at)
    AND (SELECT subqueue FROM entities WHERE id = OLD.entity_id)
        IN ('deadletter', 'transfer_deadletter')
BEGIN
    UPDATE dead_letter_aggregates SET count = count - 1
    WHERE entity_id = OLD.entity_id AND reason = json_quote(OLD.dead_letter_reason)
        AND subject = json_quote(OLD.subject) AND fingerprint = json_quote(OLD.last_fingerprint)
        AND error_type = json_quote(OLD.last_error_type)
        AND bucket = CAST(coalesce(OLD.dead_lettered_at, OLD.enqueued_at) / 3600 AS INTEGER) * 3600;
    DELETE FROM dead_letter_aggregates
    WHERE entity_id = OLD.entity_id AND reason = json_quote(OLD.dead_letter_reason)
        AND subject = json_quote(OLD.subject) AND fingerprint = json_quote(OLD.last_fingerprint)
        AND error_type = json_quote(OLD.last_error_type)
        AND bucket = CAST(coalesce(OLD.dead_lettered_at, OLD.enqueued_at) / 3600 AS INTEGER) * 3600
        AND count = 0;
END;
-- The readers' view: a message a lease covers is locked under the lease.
CREATE VIEW held_messages AS
SELECT m.seq, m.entity_id, m.message_id, m.body, m.size, m.content_type, m.subject,
    m.properties, m.session_id, m.correlation_id, m.reply_to,
    CASE WHEN l.lock_token IS NULL THEN m.state ELSE 'locked' END AS state,
    m.enqueued_at, m.scheduled_at, m.visible_at, m.expires_at,
    m.delivery_count + (l.lock_token IS NOT NULL) AS delivery_count,
    m.abort_count, m.move_count, m.resubmit_count, m.hop_count,
    coalesce(l.lock_token, m.lock_token) AS lock_token,
    coalesce(l.locked_until, m.locked_until) AS locked_until,
    m.dead_letter_reason, m.dead_letter_description, m.dead_letter_source, m.dead_lettered_at,
    m.dead_lettered_deliveries, m.last_error_type, m.last_fingerprint, m.failures,
    m.to_address, m.reply_to_session_id, m.partition_key
FROM messages m LEFT JOIN leases l
    ON l.entity_id = m.entity_id AND m.leasable = 1 AND m.state IN ('active', 'dead_lettered')
    AND l.cover_lo IS NOT NULL AND m.seq BETWEEN l.cover_lo AND l.cover_hi;
