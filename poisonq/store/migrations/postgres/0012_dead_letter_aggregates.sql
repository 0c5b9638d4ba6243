-- poisonq schema 12 (PostgreSQL): the dead-letter queues' kept aggregates. Mirrors the SQLite
-- script of the same number (the tables, their keys, the indexes, the backfill); what differs
-- is how they are kept. Transactions run side by side here, so a statement that moves
-- messages does not update the aggregates where it runs: a statement trigger writes what it
-- changed, summed by group, to dead_letter_changes under its transaction's id (rows nobody
-- else touches: no lock, no wait), and a deferred trigger folds them into the aggregates as
-- the transaction commits. By then the transaction has written the ledger, and with it locked
-- the row of every dead-letter queue whose messages it moved (a move in or out, or an abandon
-- that changed a key, always changes the queue's ledger), so two transactions never fold into
-- one queue's aggregates at once (nothing is lost, and no two wait for each other in a cycle),
-- and a fold writes its groups in key order all the same, adding with
-- count = count + excluded.count.
CREATE TABLE dead_letter_aggregates (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    reason      text NOT NULL,
    subject     text NOT NULL,
    fingerprint text NOT NULL,
    error_type  text NOT NULL,
    bucket      bigint NOT NULL,
    count       bigint NOT NULL,
    first_at    double precision NOT NULL,
    last_at     double precision NOT NULL,
    PRIMARY KEY (entity_id, reason, subject, fingerprint, error_type, bucket)
);
CREATE TABLE dead_letter_fingerprints (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    fingerprint text NOT NULL,
    error_type  text,
    description text,
    PRIMARY KEY (entity_id, fingerprint)
);
CREATE TABLE dead_letter_changes (
    xact        bigint NOT NULL,
    entity_id   bigint NOT NULL,
    reason      text NOT NULL,
    subject     text NOT NULL,
    fingerprint text NOT NULL,
    error_type  text NOT NULL,
    bucket      bigint NOT NULL,
    count       bigint NOT NULL,
    first_at    double precision NOT NULL,
    last_at     double precision NOT NULL,
    description text
);
CREATE INDEX dead_letter_changes_by_xact ON dead_letter_changes (xact);
-- What the reads see: the aggregates, and what this transaction changed that has not been
-- folded in yet (a read that follows a write in one transaction, as a read after due
-- housekeeping does, sees it; txid_current_if_assigned() gives a read-only transaction no id).
CREATE VIEW dead_letter_counts AS
SELECT entity_id, reason, subject, fingerprint, error_type, bucket, count, first_at, last_at
FROM dead_letter_aggregates
UNION ALL
SELECT entity_id, reason, subject, fingerprint, error_type, bucket, count, first_at, last_at
FROM dead_letter_changes WHERE xact = txid_current_if_assigned();
CREATE INDEX messages_by_dead_letter_reason ON messages (entity_id, dead_letter_reason, seq)
    WHERE dead_letter_reason IS NOT NULL;
CREATE INDEX messages_by_fingerprint ON messages (entity_id, last_fingerprint, seq)
    WHERE last_fingerprint IS NOT NULL;

CREATE FUNCTION poisonq_dead_letter_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO dead_letter_changes
        SELECT txid_current(), o.entity_id, coalesce(to_jsonb(o.dead_letter_reason)::text, 'null'),
            coalesce(to_jsonb(o.subject)::text, 'null'),
            coalesce(to_jsonb(o.last_fingerprint)::text, 'null'),
            coalesce(to_jsonb(o.last_error_type)::text, 'null'),
            floor(coalesce(o.dead_lettered_at, o.enqueued_at) / 3600)::bigint * 3600, -count(*),
            min(coalesce(o.dead_lettered_at, o.enqueued_at)),
            max(coalesce(o.dead_lettered_at, o.enqueued_at)), NULL
        FROM old_rows o JOIN entities e ON e.id = o.entity_id
        WHERE e.subqueue IN ('deadletter', 'transfer_deadletter')
        GROUP BY 2, 3, 4, 5, 6, 7;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO dead_letter_changes
        SELECT txid_current(), n.entity_id, coalesce(to_jsonb(n.dead_letter_reason)::text, 'null'),
            coalesce(to_jsonb(n.subject)::text, 'null'),
            coalesce(to_jsonb(n.last_fingerprint)::text, 'null'),
            coalesce(to_jsonb(n.last_error_type)::text, 'null'),
            floor(coalesce(n.dead_lettered_at, n.enqueued_at) / 3600)::bigint * 3600, count(*),
            min(coalesce(n.dead_lettered_at, n.enqueued_at)),
            max(coalesce(n.dead_lettered_at, n.enqueued_at)), max(n.failures -> -1 ->> 'message')
        FROM new_rows n JOIN entities e ON e.id = n.entity_id
        WHERE e.subqueue IN ('deadletter', 'transfer_deadletter')
        GROUP BY 2, 3, 4, 5, 6, 7;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER dead_letter_changes_insert AFTER INSERT ON messages
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION poisonq_dead_letter_changes();
CREATE TRIGGER dead_letter_changes_update AFTER UPDATE ON messages
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION poisonq_dead_letter_changes();
CREATE TRIGGER dead_letter_changes_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
    EXECUTE FUNCTION poisonq_dead_letter_changes();

-- Fired at commit for each change row; the first folds them all, the others find none.
CREATE FUNCTION poisonq_fold_dead_letter_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    emptied bigint[];
BEGIN
    WITH gone AS (DELETE FROM dead_letter_changes WHERE xact = txid_current() RETURNING *),
    kept AS (SELECT c.* FROM gone c JOIN entities e ON e.id = c.entity_id),
    named AS (
        INSERT INTO dead_letter_fingerprints
        SELECT DISTINCT ON (entity_id, fingerprint) entity_id, fingerprint,
            error_type::jsonb #>> '{}', description
        FROM kept WHERE count > 0 AND fingerprint <> 'null'
        ORDER BY entity_id, fingerprint
        ON CONFLICT DO NOTHING
    ),
    folded AS (
        INSERT INTO dead_letter_aggregates AS a
        SELECT entity_id, reason, subject, fingerprint, error_type, bucket, sum(count),
            min(first_at), max(last_at)
        FROM kept GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(count) <> 0
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (entity_id, reason, subject, fingerprint, error_type, bucket) DO UPDATE
        SET count = a.count + excluded.count, first_at = least(a.first_at, excluded.first_at),
            last_at = greatest(a.last_at, excluded.last_at)
        RETURNING a.entity_id, a.count
    )
    SELECT array_agg(DISTINCT entity_id) INTO emptied FROM folded WHERE count = 0;
    IF emptied IS NOT NULL THEN
        DELETE FROM dead_letter_aggregates WHERE entity_id = ANY(emptied) AND count = 0;
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER dead_letter_changes_fold AFTER INSERT ON dead_letter_changes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    EXECUTE FUNCTION poisonq_fold_dead_letter_changes();

-- What the dead-letter queues held before this script.
INSERT INTO dead_letter_aggregates
SELECT m.entity_id, coalesce(to_jsonb(m.dead_letter_reason)::text, 'null'),
    coalesce(to_jsonb(m.subject)::text, 'null'), coalesce(to_jsonb(m.last_fingerprint)::text, 'null'),
    coalesce(to_jsonb(m.last_error_type)::text, 'null'),
    floor(coalesce(m.dead_lettered_at, m.enqueued_at) / 3600)::bigint * 3600, count(*),
    min(coalesce(m.dead_lettered_at, m.enqueued_at)), max(coalesce(m.dead_lettered_at, m.enqueued_at))
FROM messages m JOIN entities e ON e.id = m.entity_id
WHERE e.subqueue IN ('deadletter', 'transfer_deadletter')
GROUP BY 1, 2, 3, 4, 5, 6;
INSERT INTO dead_letter_fingerprints
SELECT m.entity_id, to_jsonb(m.last_fingerprint)::text, max(m.last_error_type),
    max(m.failures -> -1 ->> 'message')
FROM messages m JOIN entities e ON e.id = m.entity_id
WHERE e.subqueue IN ('deadletter', 'transfer_deadletter') AND m.last_fingerprint IS NOT NULL
GROUP BY m.entity_id, m.last_fingerprint;
