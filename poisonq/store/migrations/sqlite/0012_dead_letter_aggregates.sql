-- poisonq schema 12: the dead-letter queues' kept aggregates, so that the explorer, the
-- /metrics scrape and `poisonq dlq list` read in proportion to groups, not messages
-- (poisonq/store/aggregates.py). For every dead-letter queue (an entity whose subqueue is
-- deadletter or transfer_deadletter), the messages it holds counted by reason, subject,
-- fingerprint and error type together (each key the JSON text of its value, 'null' for none)
-- and by the hour they were dead-lettered in (their enqueue time if they never were), with the
-- earliest and latest of those times. Kept by the triggers below in the statement that moves a
-- message, so every path (dead-letter, TTL expiry, complete, purge, resubmit, forwarding, an
-- abandon that records a failure) keeps them in its own transaction; SQLite runs one writer at
-- a time. A group's row goes when its count reaches zero; its fingerprint's error type and
-- description (its failure's message) stay in dead_letter_fingerprints for as long as the
-- queue lives, so that the chart names a resubmitted or purged fingerprint by its type.
CREATE TABLE dead_letter_aggregates (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    reason      TEXT NOT NULL,
    subject     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    error_type  TEXT NOT NULL,
    bucket      INTEGER NOT NULL,
    count       INTEGER NOT NULL,
    first_at    REAL NOT NULL,
    last_at     REAL NOT NULL,
    PRIMARY KEY (entity_id, reason, subject, fingerprint, error_type, bucket)
) STRICT, WITHOUT ROWID;
-- What the reads see (PostgreSQL adds what the transaction has not folded in yet).
CREATE VIEW dead_letter_counts AS
SELECT entity_id, reason, subject, fingerprint, error_type, bucket, count, first_at, last_at
FROM dead_letter_aggregates;
CREATE TABLE dead_letter_fingerprints (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    fingerprint TEXT NOT NULL,  -- JSON text, as in dead_letter_aggregates
    error_type  TEXT,
    description TEXT,
    PRIMARY KEY (entity_id, fingerprint)
) STRICT, WITHOUT ROWID;
-- One group's first page (by reason or fingerprint), oldest or newest first, walks these;
-- only dead letters (and messages that failed) are in them: the others have neither.
CREATE INDEX messages_by_dead_letter_reason ON messages (entity_id, dead_letter_reason, seq)
    WHERE dead_letter_reason IS NOT NULL;
CREATE INDEX messages_by_fingerprint ON messages (entity_id, last_fingerprint, seq)
    WHERE last_fingerprint IS NOT NULL;
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
CREATE TRIGGER dead_letter_aggregates_delete AFTER DELETE ON messages
WHEN (SELECT subqueue FROM entities WHERE id = OLD.entity_id)
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
-- A move between entities, or a change of a key (an abandon in a dead-letter queue records
-- a failure, and with it a new fingerprint): out of the old group, into the new one.
CREATE TRIGGER dead_letter_aggregates_update
AFTER UPDATE OF entity_id, dead_letter_reason, subject, last_fingerprint, last_error_type,
    dead_lettered_at ON messages
WHEN (OLD.entity_id IS NOT NEW.entity_id OR OLD.dead_letter_reason IS NOT NEW.dead_letter_reason
        OR OLD.subject IS NOT NEW.subject OR OLD.last_fingerprint IS NOT NEW.last_fingerprint
        OR OLD.last_error_type IS NOT NEW.last_error_type
        OR OLD.dead_lettered_at IS NOT NEW.dead_lettered_at)
    AND EXISTS (SELECT 1 FROM entities WHERE id IN (OLD.entity_id, NEW.entity_id)
        AND subqueue IN ('deadletter', 'transfer_deadletter'))
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
    INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type,
        bucket, count, first_at, last_at)
    SELECT NEW.entity_id, json_quote(NEW.dead_letter_reason), json_quote(NEW.subject),
        json_quote(NEW.last_fingerprint), json_quote(NEW.last_error_type),
        CAST(coalesce(NEW.dead_lettered_at, NEW.enqueued_at) / 3600 AS INTEGER) * 3600, 1,
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at),
        coalesce(NEW.dead_lettered_at, NEW.enqueued_at)
    FROM entities WHERE id = NEW.entity_id AND subqueue IN ('deadletter', 'transfer_deadletter')
    ON CONFLICT DO UPDATE SET count = count + 1, first_at = min(first_at, excluded.first_at),
        last_at = max(last_at, excluded.last_at);
    INSERT INTO dead_letter_fingerprints (entity_id, fingerprint, error_type, description)
    SELECT NEW.entity_id, json_quote(NEW.last_fingerprint), NEW.last_error_type, json_extract(NEW.failures, '$[#-1].message')
    FROM entities WHERE id = NEW.entity_id AND subqueue IN ('deadletter', 'transfer_deadletter')
        AND NEW.last_fingerprint IS NOT NULL
    ON CONFLICT DO NOTHING;
END;
-- What the dead-letter queues held before this script.
INSERT INTO dead_letter_aggregates (entity_id, reason, subject, fingerprint, error_type, bucket,
    count, first_at, last_at)
SELECT m.entity_id, json_quote(m.dead_letter_reason), json_quote(m.subject),
    json_quote(m.last_fingerprint), json_quote(m.last_error_type),
    CAST(coalesce(m.dead_lettered_at, m.enqueued_at) / 3600 AS INTEGER) * 3600, count(*),
    min(coalesce(m.dead_lettered_at, m.enqueued_at)), max(coalesce(m.dead_lettered_at, m.enqueued_at))
FROM messages m JOIN entities e ON e.id = m.entity_id
WHERE e.subqueue IN ('deadletter', 'transfer_deadletter')
GROUP BY 1, 2, 3, 4, 5, 6;
INSERT INTO dead_letter_fingerprints (entity_id, fingerprint, error_type, description)
SELECT m.entity_id, json_quote(m.last_fingerprint), max(m.last_error_type), max(json_extract(m.failures, '$[#-1].message'))
FROM messages m JOIN entities e ON e.id = m.entity_id
WHERE e.subqueue IN ('deadletter', 'transfer_deadletter') AND m.last_fingerprint IS NOT NULL
GROUP BY m.entity_id, m.last_fingerprint;
