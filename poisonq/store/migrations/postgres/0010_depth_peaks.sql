-- poisonq schema 10 (PostgreSQL): the highest depth each depth_history bucket reached. Mirrors
-- the SQLite script of the same number (rows from before it have a NULL peak).
ALTER TABLE depth_history ADD COLUMN peak bigint;
