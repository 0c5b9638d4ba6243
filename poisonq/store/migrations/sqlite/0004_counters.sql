-- poisonq schema 4: two more lifetime counters per entity, for metrics: messages abandoned by
-- a receiver (lock expiries are counted apart) and poison events (messages that used every
-- attempt and were dead-lettered or dropped by the retry policy).
-- Numbered 4, not 3: schema 3 is on its way from another branch (sessions and rollbacks);
-- the runner applies every script numbered above the file's version, in order.

ALTER TABLE entities ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE entities ADD COLUMN poisoned INTEGER NOT NULL DEFAULT 0;
