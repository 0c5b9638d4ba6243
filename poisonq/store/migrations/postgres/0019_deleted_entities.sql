-- poisonq schema 19: what a deleted entity's ledger held when it went, a row for each entity
-- deleted (a queue and each of its subqueues, a topic and each of its subscriptions). The
-- audit's global balance (sent = completed + dropped + held) holds only while moves between
-- entities cancel out: a queue that held messages moved in from another (a resubmit to it, a
-- reject into its dead-letter queue) took its moved_in with it, while the other kept its
-- moved_out. The audit sums these rows with the living entities, in the statement that reads
-- them; the messages the entity still held (discarded) count as dropped.
CREATE TABLE deleted_entities (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_id   bigint NOT NULL,
    name        text NOT NULL,
    deleted_at  double precision NOT NULL,
    sent        bigint NOT NULL,
    moved_in    bigint NOT NULL,
    completed   bigint NOT NULL,
    dropped     bigint NOT NULL,
    moved_out   bigint NOT NULL,
    discarded   bigint NOT NULL DEFAULT 0
);
