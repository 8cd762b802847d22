-- The sweep pages a shard's queued runs in (due_at, id) order: with id in the index, a page is
-- a range read that stops at its end, not a sort of every overdue run of the shard.
DROP INDEX runs_dispatch;
CREATE INDEX runs_dispatch ON runs (shard, status, due_at, id);
