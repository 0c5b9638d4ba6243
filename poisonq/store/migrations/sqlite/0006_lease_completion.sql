-- poisonq schema 6: a lease records when it was completed, so that a consumer restarted after
-- its lease's locks ran out can tell a finished batch (its output stands) from one that died
-- before completing (its output is an orphan: its messages come again in a later lease).

ALTER TABLE leases ADD COLUMN completed_at REAL;
