-- PostgreSQL statements of the table delay queue (onbeat.queue.table_postgres), by name.
-- {table}, {claim_index} and {channel} are identifiers filled in per queue (psycopg.sql);
-- every other input is a bound parameter. Times are integer microseconds since the epoch (UTC),
-- always the caller's clock, never now(): a FakeClock drives the queue as it drives the store.
-- Each statement runs alone in autocommit mode, so each is its own transaction.

-- name: schema
-- Created on open. One row per waiting execution id; a claim deletes its rows. The advisory
-- lock serialises two processes creating the same table (CREATE ... IF NOT EXISTS races).
SELECT pg_advisory_xact_lock(hashtext('onbeat_queue_schema'));
CREATE TABLE IF NOT EXISTS {table} (
    execution_id text PRIMARY KEY,
    shard int NOT NULL,
    priority int NOT NULL,
    due_at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {claim_index} ON {table} (priority DESC, due_at);

-- name: enqueue
-- Upsert one batch (unique ids, as arrays) and tell waiting processes its earliest due time.
-- A repeat with the same values (the sweep's) writes nothing: no dead tuple, no index churn.
-- The NOTIFY is delivered at commit, once per batch; a waiter wakes only if the payload is
-- due before it would wake anyway.
WITH upserted AS (
    INSERT INTO {table} AS q (execution_id, shard, priority, due_at)
    SELECT * FROM unnest(%(ids)s::text[], %(shards)s::int[], %(priorities)s::int[],
                         %(due_ats)s::bigint[])
    ON CONFLICT (execution_id) DO UPDATE
        SET shard = excluded.shard, priority = excluded.priority, due_at = excluded.due_at
        WHERE (q.shard, q.priority, q.due_at)
              IS DISTINCT FROM (excluded.shard, excluded.priority, excluded.due_at)
    RETURNING 1
)
SELECT pg_notify(%(channel)s, %(earliest)s);

-- name: claim
-- Take up to :limit due ids, highest priority first, then earliest due. Each priority tier is
-- one index range (priority = tier AND due_at <= :now), found by the loose index scan of
-- `earliest` and read in order until the batch is full, so future rows are never read: a
-- single scan of the claim index filtered on due_at read every future row whenever fewer than
-- :limit were due (8-11 ms a claim with 100,000 runs queued ahead of their time).
-- SKIP LOCKED lets concurrent claimers pass each other's rows instead of queueing behind them;
-- the DELETE makes each id one claimer's, by primary key (= ANY of an array: a join with the
-- CTE was planned as a sequential scan of the table at 20,000 rows).
WITH RECURSIVE tiers (priority) AS (
    (SELECT priority FROM {table} ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT q.priority FROM {table} q WHERE q.priority < tiers.priority
            ORDER BY q.priority DESC LIMIT 1)
    FROM tiers WHERE tiers.priority IS NOT NULL
), due AS (
    SELECT tier.execution_id
    FROM tiers CROSS JOIN LATERAL (
        SELECT q.execution_id FROM {table} q
        WHERE q.priority = tiers.priority AND q.due_at <= %(now)s
        ORDER BY q.due_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) tier
    LIMIT %(limit)s
), claimed AS (
    DELETE FROM {table}
    WHERE execution_id = ANY(ARRAY(SELECT execution_id FROM due))
    RETURNING execution_id, priority, due_at
)
SELECT execution_id FROM claimed ORDER BY priority DESC, due_at;

-- name: remove
DELETE FROM {table} WHERE execution_id = ANY(%(ids)s::text[]);

-- name: missing
-- The asked ids the table does not hold, in the order asked: one query per sweep page.
SELECT asked.id
FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS asked (id, position)
WHERE NOT EXISTS (SELECT 1 FROM {table} q WHERE q.execution_id = asked.id)
ORDER BY asked.position;

-- name: earliest
-- The earliest due time waiting (NULL when empty) without a second index on due_at: a loose
-- index scan hops from priority tier to tier on the claim index and takes each tier's head, so
-- it costs a few index probes per tier rather than a scan of every row.
WITH RECURSIVE tiers (priority) AS (
    (SELECT priority FROM {table} ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT q.priority FROM {table} q WHERE q.priority < tiers.priority
            ORDER BY q.priority DESC LIMIT 1)
    FROM tiers WHERE tiers.priority IS NOT NULL
)
SELECT min((SELECT q.due_at FROM {table} q WHERE q.priority = tiers.priority
            ORDER BY q.due_at LIMIT 1))
FROM tiers WHERE tiers.priority IS NOT NULL;

-- name: size
SELECT count(*) FROM {table};

-- name: listen
LISTEN {channel};
