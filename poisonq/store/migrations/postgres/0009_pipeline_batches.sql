-- poisonq schema 9 (PostgreSQL): a pipeline run's timeline, one row per batch (a lease of a
-- consumer). The engine writes a row in the transaction that completes the lease and forgets
-- the consumer's older rows past the number it keeps. dead_lettered is JSON text, a count by
-- reason. Nothing here depends on schema 8, so a store may take 8 and 9 in either order.

CREATE TABLE pipeline_batches (
    entity_id       bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    consumer        text NOT NULL,
    lease           bigint NOT NULL,
    started_at      double precision NOT NULL,
    seconds         double precision NOT NULL,
    size            bigint NOT NULL,
    completed       bigint NOT NULL,
    retried         bigint NOT NULL,
    dead_lettered   text NOT NULL,
    isolation_jobs  bigint NOT NULL,
    PRIMARY KEY (entity_id, consumer, lease)
);
