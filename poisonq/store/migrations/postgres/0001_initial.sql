-- poisonq schema 1 (PostgreSQL): entities with their ledger, messages, duplicate-detection ids,
-- tasks. The same tables and columns as the SQLite schema of the same number, so that a store
-- method reads alike in both. Times are seconds since the epoch (double precision), stamped by
-- the engine's clock, never by the server's now(). Values of the CHECK constraints mirror the
-- StrEnums in poisonq/model.py; tests/test_schema.py proves they agree.

CREATE TABLE entities (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL UNIQUE,
    parent_id       bigint REFERENCES entities(id) ON DELETE CASCADE,
    subqueue        text CHECK (subqueue IN ('deadletter', 'retry', 'transfer_deadletter')),
    status          text NOT NULL DEFAULT 'active'
                    CHECK (status IN ('active', 'disabled', 'send_disabled', 'receive_disabled')),
    status_cause    text,
    options         text NOT NULL,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL,
    -- The ledger: sent + moved_in = completed + dropped + moved_out + held, always.
    sent            bigint NOT NULL DEFAULT 0,
    moved_in        bigint NOT NULL DEFAULT 0,
    completed       bigint NOT NULL DEFAULT 0,
    dropped         bigint NOT NULL DEFAULT 0,
    moved_out       bigint NOT NULL DEFAULT 0,
    dead_lettered   bigint NOT NULL DEFAULT 0,
    resubmitted     bigint NOT NULL DEFAULT 0,
    lock_expiries   bigint NOT NULL DEFAULT 0,
    size_bytes      bigint NOT NULL DEFAULT 0
);

-- Unlike the SQLite schema, the body stays in the message row: PostgreSQL moves a body larger
-- than about 2 kB out of line (TOAST) by itself, and an UPDATE that leaves it alone copies only
-- a pointer, so a separate table would cost an insert and a join without saving a copy.
CREATE TABLE messages (
    seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_id           bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    state               text NOT NULL CHECK (state IN ('scheduled', 'active', 'locked',
                        'deferred', 'dead_lettered', 'completed', 'dropped')),
    message_id          text NOT NULL,
    body                bytea NOT NULL,
    size                integer NOT NULL,
    content_type        text,
    subject             text,
    properties          text,
    session_id          text,
    correlation_id      text,
    reply_to            text,
    enqueued_at         double precision NOT NULL,
    scheduled_at        double precision,
    visible_at          double precision,
    expires_at          double precision,
    delivery_count      integer NOT NULL DEFAULT 0,
    abort_count         integer NOT NULL DEFAULT 0,
    move_count          integer NOT NULL DEFAULT 0,
    resubmit_count      integer NOT NULL DEFAULT 0,
    hop_count           integer NOT NULL DEFAULT 0,
    lock_token          text,
    locked_until        double precision,
    dead_letter_reason  text,
    dead_letter_description text,
    dead_letter_source  text,
    dead_lettered_at    double precision,
    last_error_type     text,
    last_fingerprint    text,
    failures            jsonb
);

-- Receive (FIFO among active), lock-expiry sweeps and listings all walk this index.
CREATE INDEX messages_by_state ON messages (entity_id, state, seq);
CREATE INDEX messages_scheduled ON messages (entity_id, visible_at) WHERE state = 'scheduled';
CREATE INDEX messages_expiring ON messages (entity_id, expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE seen_message_ids (
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    message_id  text NOT NULL,
    expires_at  double precision NOT NULL,
    PRIMARY KEY (entity_id, message_id)
);
CREATE INDEX seen_message_ids_expiring ON seen_message_ids (expires_at);

CREATE TABLE tasks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('resubmit', 'purge')),
    entity_id   bigint NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'cancelled', 'failed')),
    spec        text NOT NULL,
    total       bigint NOT NULL,
    done        bigint NOT NULL DEFAULT 0,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    error       text
);
