-- Fleet limits (onbeat.limits): per-tenant overrides of the limits, and the counters a claim
-- decides on. tenant_usage has one row per tenant that ever had a run claimed, and the fleet's
-- row (tenant ''): running = runs in flight, tat = the starts/s limit's theoretical arrival time
-- (microseconds; NULL before the first start under a rate). Filled here from the runs running
-- now, so the counters are right from the first claim after the upgrade.

CREATE TABLE tenant_limits (
    tenant                TEXT COLLATE "C" PRIMARY KEY,
    max_in_flight         INTEGER,                  -- NULL: the fleet's default
    max_starts_per_second DOUBLE PRECISION,         -- NULL: the fleet's default
    updated_at            BIGINT NOT NULL
);

CREATE TABLE tenant_usage (
    tenant  TEXT COLLATE "C" PRIMARY KEY,           -- '' is the whole fleet
    running BIGINT NOT NULL,
    tat     BIGINT
);

INSERT INTO tenant_usage (tenant, running)
SELECT j.tenant, count(*) FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' GROUP BY j.tenant;

INSERT INTO tenant_usage (tenant, running)
SELECT '', count(*) FROM executions WHERE status = 'running';
