-- poisonq schema 14: when a session's state was last set, so that the sessions whose state
-- changed since a time can be listed (azure-servicebus' list_queue_sessions). NULL for a
-- state set before this script.
ALTER TABLE sessions ADD COLUMN state_updated_at REAL;
