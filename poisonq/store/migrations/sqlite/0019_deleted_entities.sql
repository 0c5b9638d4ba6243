-- poisonq schema 19: what a deleted entity's ledger held when it went, a row for each entity
-- deleted (a queue and each of its subqueues, a topic and each of its subscriptions). The
-- audit's global balance (sent = completed + dropped + held) holds only while moves between
-- entities cancel out: a queue that held messages moved in from another (a resubmit to it, a
-- reject into its dead-letter queue) took its moved_in with it, while the other kept its
-- moved_out. The audit sums these rows with the living entities; the messages the entity
-- still held (discarded) count as dropped.
CREATE TABLE deleted_entities (
    id          INTEGER PRIMARY KEY,
    entity_id   INTEGER NOT NULL,
    name        TEXT NOT NULL,
    deleted_at  REAL NOT NULL,
    sent        INTEGER NOT NULL,
    moved_in    INTEGER NOT NULL,
    completed   INTEGER NOT NULL,
    dropped     INTEGER NOT NULL,
    moved_out   INTEGER NOT NULL,
    discarded   INTEGER NOT NULL DEFAULT 0
) STRICT;
