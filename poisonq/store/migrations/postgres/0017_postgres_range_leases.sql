-- poisonq schema 17: a lease locks the fresh part of its batch as one range, as SQLite's
-- schema 7 does, instead of locking every message row. A message is "leasable" until it first
-- leaves the state it was sent in and comes back (an abandon, a release, a lock expiry, a
-- move, a promotion from scheduled): a ready, leasable message inside a lease's cover range is
-- held by that lease, under its token and lock, with one more delivery than its row says.
-- The others a lease locks row by row. Taking a cover excludes, per entity, whatever could
-- claim a message the cover takes (poisonq/store/postgres/covers.py).
ALTER TABLE messages ADD COLUMN leasable smallint NOT NULL DEFAULT 1;
ALTER TABLE leases ADD COLUMN locked_until double precision;
ALTER TABLE leases ADD COLUMN cover_lo bigint;
ALTER TABLE leases ADD COLUMN cover_hi bigint;
CREATE INDEX leases_by_cover ON leases (entity_id, cover_lo) WHERE cover_lo IS NOT NULL;
-- The receivable messages inside cover ranges: those that came back since they were sent.
CREATE INDEX messages_unleasable ON messages (entity_id, state, seq) WHERE leasable = 0;
-- The messages as readers see them: a message a lease covers is locked under the lease.
CREATE VIEW held_messages AS
SELECT m.seq, m.entity_id, m.message_id, m.body, m.size, m.content_type, m.subject,
    m.properties, m.session_id, m.correlation_id, m.reply_to,
    CASE WHEN l.lock_token IS NULL THEN m.state ELSE 'locked' END AS state,
    m.enqueued_at, m.scheduled_at, m.visible_at, m.expires_at,
    m.delivery_count + (l.lock_token IS NOT NULL)::int AS delivery_count,
    m.abort_count, m.move_count, m.resubmit_count, m.hop_count,
    coalesce(l.lock_token, m.lock_token) AS lock_token,
    coalesce(l.locked_until, m.locked_until) AS locked_until,
    m.dead_letter_reason, m.dead_letter_description, m.dead_letter_source, m.dead_lettered_at,
    m.dead_lettered_deliveries, m.last_error_type, m.last_fingerprint, m.failures,
    m.to_address, m.reply_to_session_id, m.partition_key
FROM messages m LEFT JOIN leases l
    ON l.entity_id = m.entity_id AND m.leasable = 1 AND m.state IN ('active', 'dead_lettered')
    AND l.cover_lo IS NOT NULL AND m.seq BETWEEN l.cover_lo AND l.cover_hi;
