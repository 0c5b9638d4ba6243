-- poisonq schema 6 (PostgreSQL): a lease records when it was completed and how often it was
-- planned, so that a consumer
-- restarted after its lease's locks ran out can tell a finished batch (its output stands) from
-- one that died before completing (its output is an orphan: its messages come again later).

ALTER TABLE leases ADD COLUMN completed_at double precision;
-- A lease planned again is a batch replayed after its query failed: the source narrows it.
ALTER TABLE leases ADD COLUMN planned bigint NOT NULL DEFAULT 0;
