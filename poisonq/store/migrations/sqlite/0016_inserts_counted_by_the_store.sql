-- poisonq schema 16: the store counts what it inserts into a dead-letter queue in the
-- aggregates (schema 12) itself, once per statement, as it counts what it deletes (schema 15).
-- The insert trigger ran its program for every message sent to ask whether the message's
-- entity is a dead-letter queue: about a fifth of the cost of a send's INSERT, for a question
-- whose answer is the same for the whole statement (and, for a send, always no).
DROP TRIGGER dead_letter_aggregates_insert;
