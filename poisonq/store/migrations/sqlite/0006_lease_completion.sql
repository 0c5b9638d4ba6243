-- poisonq schema 6: a lease records when it was completed and how often it was planned, so that a consumer restarted after
-- its lease's locks ran out can tell a finished batch (its output stands) from one that died
-- before completing (its output is an orphan: its messages come again in a later lease).

ALTER TABLE leases ADD COLUMN completed_at REAL;
-- A lease planned again is a batch replayed after its query failed: the source narrows it.
ALTER TABLE leases ADD COLUMN planned INTEGER NOT NULL DEFAULT 0;
