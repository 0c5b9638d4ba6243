-- poisonq schema 18: the store counts what moves into or out of a dead-letter queue, or
-- changes its keys there, in the dead-letter aggregates (schema 12) itself, once per
-- statement, as it counts what it inserts (schema 16) and deletes (schema 15). The two update
-- triggers of schema 15 asked, for every message a statement moved, whether its old and its
-- new entity are dead-letter queues, and upserted its group one message at a time: about a
-- tenth of a dead-letter batch. Three statements move messages or change their keys (a move, a
-- dead-lettering, an abandon that records a failure); SqliteTransaction counts around each.
DROP TRIGGER dead_letter_aggregates_enter;
DROP TRIGGER dead_letter_aggregates_leave;
