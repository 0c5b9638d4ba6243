-- poisonq schema 14 (PostgreSQL): when a session's state was last set. Mirrors the SQLite
-- script of the same number.
ALTER TABLE sessions ADD COLUMN state_updated_at double precision;
