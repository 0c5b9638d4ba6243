-- poisonq schema 13: the message fields Service Bus has and poisonq did not keep: ``to`` (the
-- address a message is for, which no broker rule reads), ``reply_to_session_id`` (the session
-- a reply belongs to) and ``partition_key``. NULL for the messages from before this script.
ALTER TABLE messages ADD COLUMN to_address TEXT;
ALTER TABLE messages ADD COLUMN reply_to_session_id TEXT;
ALTER TABLE messages ADD COLUMN partition_key TEXT;
-- The readers' view of schema 7, with the new columns.
DROP VIEW held_messages;
CREATE VIEW held_messages AS
SELECT m.seq, m.entity_id, m.message_id, m.body_id, m.size, m.content_type, m.subject,
    m.properties, m.session_id, m.correlation_id, m.reply_to,
    CASE WHEN l.lock_token IS NULL THEN m.state ELSE 'locked' END AS state,
    m.enqueued_at, m.scheduled_at, m.visible_at, m.expires_at,
    m.delivery_count + (l.lock_token IS NOT NULL) AS delivery_count,
    m.abort_count, m.move_count, m.resubmit_count, m.hop_count,
    coalesce(l.lock_token, m.lock_token) AS lock_token,
    coalesce(l.locked_until, m.locked_until) AS locked_until,
    m.dead_letter_reason, m.dead_letter_description, m.dead_letter_source, m.dead_lettered_at,
    m.dead_lettered_deliveries, m.last_error_type, m.last_fingerprint, m.failures,
    m.to_address, m.reply_to_session_id, m.partition_key
FROM messages m LEFT JOIN leases l
    ON l.entity_id = m.entity_id AND m.leasable = 1 AND m.state IN ('active', 'dead_lettered')
    AND l.cover_lo IS NOT NULL AND m.seq BETWEEN l.cover_lo AND l.cover_hi;
