-- poisonq schema 11 (PostgreSQL): who started and who cancelled a task. Mirrors the SQLite
-- script of the same number (tasks from before it have NULL in both).
ALTER TABLE tasks ADD COLUMN started_by text;
ALTER TABLE tasks ADD COLUMN cancelled_by text;
CREATE INDEX tasks_by_entity ON tasks (entity_id, id);
