-- poisonq schema 11: who started and who cancelled a task (the name an operator gave at the
-- web UI's login, or the user and host of the command line), so that the task list is an
-- audit trail that every process writes and that outlives a server. Tasks from before this
-- script have neither (NULL). An index finds a queue's tasks newest first.
ALTER TABLE tasks ADD COLUMN started_by TEXT;
ALTER TABLE tasks ADD COLUMN cancelled_by TEXT;
CREATE INDEX tasks_by_entity ON tasks (entity_id, id);
