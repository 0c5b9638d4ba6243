-- poisonq schema 9: a pipeline run's timeline, one row per batch (a lease of a consumer).
-- The engine writes a row in the transaction that completes the lease and forgets the
-- consumer's older rows past the number it keeps. dead_lettered is JSON, a count by reason.
-- Nothing here depends on schema 8, so a store may take 8 and 9 in either order.

CREATE TABLE pipeline_batches (
    entity_id       INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    consumer        TEXT NOT NULL,
    lease           INTEGER NOT NULL,
    started_at      REAL NOT NULL,
    seconds         REAL NOT NULL,
    size            INTEGER NOT NULL,
    completed       INTEGER NOT NULL,
    retried         INTEGER NOT NULL,
    dead_lettered   TEXT NOT NULL,
    isolation_jobs  INTEGER NOT NULL,
    PRIMARY KEY (entity_id, consumer, lease)
) STRICT;
