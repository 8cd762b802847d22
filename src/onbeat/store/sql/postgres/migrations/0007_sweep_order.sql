-- The sweep pages queued runs in (shard, due_at, id) order. Without id in the index, a page read
-- every queued run overdue and sorted them to return the first 1,000 (a backlog of 100,000:
-- every pass, every second); with it, the range read of the shard array stops at the page's end.
DROP INDEX runs_dispatch;
CREATE INDEX runs_dispatch ON runs (shard, status, due_at, id) WHERE status IN ('scheduled', 'queued');
