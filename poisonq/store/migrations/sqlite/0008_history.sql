-- poisonq schema 8: a bounded history for the explorer's charts (poisonq/store/history.py).
-- Buckets of a minute (span 60, kept 25 hours) and of an hour (span 3600, kept 8 days) per
-- entity: the messages dead-lettered into it by reason, subject and fingerprint together (each
-- key the JSON text of its value, 'null' for none), and the depth it had before the first
-- change of each bucket in which it changed. Written with the commit of the work they count;
-- pruned by age. Numbered 8; 9 is on its way from another branch.
CREATE TABLE dead_letter_history (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    span        INTEGER NOT NULL,
    bucket      INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    subject     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (entity_id, span, bucket, reason, subject, fingerprint)
) STRICT, WITHOUT ROWID;
CREATE INDEX dead_letter_history_by_age ON dead_letter_history (span, bucket);
CREATE TABLE depth_history (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    span        INTEGER NOT NULL,
    bucket      INTEGER NOT NULL,
    opened      INTEGER NOT NULL,
    PRIMARY KEY (entity_id, span, bucket)
) STRICT, WITHOUT ROWID;
CREATE INDEX depth_history_by_age ON depth_history (span, bucket);
