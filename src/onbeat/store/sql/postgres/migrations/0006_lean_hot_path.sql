-- A leaner hot path (issue 10).
--
-- tenant_usage: each tenant's counters (and the fleet's, tenant '') are spread over 16 stripes.
-- A transaction that starts or ends runs and decides no limit adds its change to one stripe
-- (chosen at random per statement), so concurrent claims and finishes no longer queue on the
-- fleet's one row from their tenant_usage_add to their commit (a WAL flush each). A claim that
-- decides a limit locks every stripe of the counters it reads, in (tenant, stripe) order, and
-- reads their sum; the GCRA arrival time lives on stripe 0. The rows there now become stripe 0.
ALTER TABLE tenant_usage ADD COLUMN stripe SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE tenant_usage DROP CONSTRAINT tenant_usage_pkey;
ALTER TABLE tenant_usage ADD PRIMARY KEY (tenant, stripe);

-- No statement looks running runs up by owner any more (a heartbeat names its runs' ids, the
-- dashboard's count per owner reads every running run): one index fewer to write at each claim.
DROP INDEX runs_lease_owner;

-- The reconciler pages a shard's active cron jobs: the index holds those only, so creating a
-- one-shot job writes no entry to it.
DROP INDEX jobs_shard_active;
CREATE INDEX jobs_shard_active ON jobs (shard, id) WHERE status = 'active' AND schedule_kind = 'cron';

-- An attempt is inserted when its run starts and updated once when it ends: room left in each
-- page lets that update be HOT (no new index entry). Day partitions are created with it too
-- (partition_create).
ALTER TABLE attempts_default SET (fillfactor = 70);
