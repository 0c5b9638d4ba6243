-- poisonq schema 17: nothing changes in SQLite, whose leases lock by range since schema 7.
-- PostgreSQL's schema 17 gives it the same covers. The number is kept so that both stores
-- count the same versions.
SELECT 1;
