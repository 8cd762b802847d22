-- SQLite statements of the table delay queue (onbeat.queue.table_sqlite), by name.
-- {table} and {claim_index} are quoted identifiers filled in per queue; every other input is a
-- bound parameter. Times are integer microseconds since the epoch (UTC), always the caller's
-- clock. Lists of ids travel as one JSON array parameter, read with json_each().

-- name: schema
-- Created on open. One row per waiting execution id; a claim deletes its rows.
CREATE TABLE IF NOT EXISTS {table} (
    execution_id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    due_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {claim_index} ON {table} (priority DESC, due_at);

-- name: enqueue
-- Run once per item of a batch (executemany) inside one BEGIN IMMEDIATE transaction; the
-- parameters are positional, (execution_id, shard, priority, due_at), which binds rows as they
-- are (twice as fast as named ones). A repeat with the same values (the sweep's) writes nothing.
INSERT INTO {table} AS q (execution_id, shard, priority, due_at)
VALUES (?, ?, ?, ?)
ON CONFLICT (execution_id) DO UPDATE
    SET shard = excluded.shard, priority = excluded.priority, due_at = excluded.due_at
    WHERE q.shard <> excluded.shard OR q.priority <> excluded.priority
       OR q.due_at <> excluded.due_at;

-- name: tiers
-- The priority tiers waiting, highest first: the loose index scan of `earliest`. A claim reads
-- them, then each tier's due rows (`claim_tier`), in one BEGIN IMMEDIATE (the single writer).
WITH RECURSIVE tiers (priority) AS (
    SELECT (SELECT priority FROM {table} ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT q.priority FROM {table} q WHERE q.priority < tiers.priority
            ORDER BY q.priority DESC LIMIT 1)
    FROM tiers WHERE tiers.priority IS NOT NULL
)
SELECT priority FROM tiers WHERE priority IS NOT NULL;

-- name: claim_tier
-- Up to :limit due ids of one tier, earliest due first: one index range, so rows queued ahead
-- of their time are never read (one scan of the index filtered on due_at read them all
-- whenever fewer than :limit were due). The claim then deletes them with `remove`.
SELECT execution_id FROM {table}
WHERE priority = :priority AND due_at <= :now
ORDER BY due_at
LIMIT :limit;

-- name: remove
DELETE FROM {table} WHERE execution_id IN (SELECT value FROM json_each(:ids));

-- name: missing
-- The asked ids the table does not hold, in the order asked: one query per sweep page.
SELECT asked.value
FROM json_each(:ids) AS asked
WHERE NOT EXISTS (SELECT 1 FROM {table} q WHERE q.execution_id = asked.value)
ORDER BY asked.key;

-- name: earliest
-- The earliest due time waiting (NULL when empty) without a second index on due_at: a loose
-- index scan hops from priority tier to tier on the claim index and takes each tier's head.
WITH RECURSIVE tiers (priority) AS (
    SELECT (SELECT priority FROM {table} ORDER BY priority DESC LIMIT 1)
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
