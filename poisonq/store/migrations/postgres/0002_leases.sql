-- poisonq schema 2 (PostgreSQL): leases, the named batches a Spark query or pipeline locks at
-- once. A lease names the lock token its messages carry, so the messages themselves say which
-- lease holds them; the row only keeps what a restarted query needs to find and split its lease.

CREATE TABLE leases (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    consumer    text NOT NULL,
    number      bigint NOT NULL CHECK (number >= 1),
    lock_token  text NOT NULL,
    count       bigint NOT NULL,
    min_seq     bigint NOT NULL,
    max_seq     bigint NOT NULL,
    created_at  double precision NOT NULL,
    PRIMARY KEY (entity_id, consumer, number)
);
