-- The reconciler reads the active cron jobs of the held shards a page at a time, in (shard, id)
-- order: without this index each page scanned every job (100,000 cron jobs: 100 full scans a
-- pass, each inside the write transaction).
CREATE INDEX jobs_shard_active ON jobs (shard, id) WHERE status = 'active' AND schedule_kind = 'cron';
