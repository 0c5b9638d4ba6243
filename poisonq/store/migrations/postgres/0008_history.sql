-- poisonq schema 8 (PostgreSQL): a bounded history for the explorer's charts
-- (poisonq/store/history.py). Mirrors the SQLite script of the same number. A history row is
-- written only by a transaction that holds its entity's row (the ledger's update), so the
-- foreign key's check takes no lock another writer waits for.
CREATE TABLE dead_letter_history (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    span        integer NOT NULL,
    bucket      bigint NOT NULL,
    reason      text NOT NULL,
    subject     text NOT NULL,
    fingerprint text NOT NULL,
    count       bigint NOT NULL,
    PRIMARY KEY (entity_id, span, bucket, reason, subject, fingerprint)
);
CREATE INDEX dead_letter_history_by_age ON dead_letter_history (span, bucket);
CREATE TABLE depth_history (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    span        integer NOT NULL,
    bucket      bigint NOT NULL,
    opened      bigint NOT NULL,
    PRIMARY KEY (entity_id, span, bucket)
);
CREATE INDEX depth_history_by_age ON depth_history (span, bucket);
