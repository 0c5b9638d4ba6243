-- poisonq schema 4 (PostgreSQL): two more lifetime counters per entity, for metrics: messages
-- abandoned by a receiver (lock expiries are counted apart) and poison events (messages that
-- used every attempt and were dead-lettered or dropped by the retry policy). Mirrors the
-- SQLite script of the same number.

ALTER TABLE entities ADD COLUMN abandoned bigint NOT NULL DEFAULT 0;
ALTER TABLE entities ADD COLUMN poisoned bigint NOT NULL DEFAULT 0;
