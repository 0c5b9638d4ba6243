-- poisonq schema 7: nothing changes in PostgreSQL. SQLite's schema 7 lets a lease lock the
-- fresh part of its batch as one range; PostgreSQL keeps row locks, which competing consumers
-- skip (SKIP LOCKED). The number is kept so that both stores count the same versions.
SELECT 1;
