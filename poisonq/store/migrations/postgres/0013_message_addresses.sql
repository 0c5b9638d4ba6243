-- poisonq schema 13 (PostgreSQL): a message's ``to``, ``reply_to_session_id`` and
-- ``partition_key``. Mirrors the SQLite script of the same number (which also recreates its
-- readers' view; PostgreSQL has none).
ALTER TABLE messages ADD COLUMN to_address text;
ALTER TABLE messages ADD COLUMN reply_to_session_id text;
ALTER TABLE messages ADD COLUMN partition_key text;
