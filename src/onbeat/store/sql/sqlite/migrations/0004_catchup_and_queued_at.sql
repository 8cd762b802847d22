-- A run the misfire policy chose to run although its fire time was missed is marked as a catch-up;
-- queued_at is when the scheduler handed a run to the delay queue, so a worker can tell a run that
-- waited in a lost queue through an outage (a misfire) from one dispatched late on purpose.

ALTER TABLE executions ADD COLUMN catchup INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN queued_at INTEGER;
