-- poisonq schema 18: nothing changes in PostgreSQL, whose dead-letter aggregates are folded
-- from each statement's changes at commit (schema 12). SQLite's schema 18 drops its row
-- triggers for the store's own counting. The number is kept so that both stores count the
-- same versions.
SELECT 1;
