-- poisonq schema 2: leases, the named batches a Spark query or pipeline locks at once.
-- A lease names the lock token its messages carry, so the messages themselves say which lease
-- holds them; the row only keeps what a restarted query needs to find and split its lease.

CREATE TABLE leases (
    entity_id   INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    consumer    TEXT NOT NULL,
    number      INTEGER NOT NULL CHECK (number >= 1),
    lock_token  TEXT NOT NULL,
    count       INTEGER NOT NULL,
    min_seq     INTEGER NOT NULL,
    max_seq     INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (entity_id, consumer, number)
) STRICT;
