-- Helpers prepended (at load time) to every shard_*.lua script; not a script of its own.
--
-- A shard script works on one or more shards ("groups"). Group g owns KEYS[3g-2..3g]:
--   <prefix>:{<shard>}:items    HASH    execution id -> the tier it is held in
--   <prefix>:{<shard>}:tiers    SET     tiers of the shard holding at least one id
--   <prefix>:{<shard>}:version  STRING  the shard's state version
-- and its tier keys are built from its due prefix "<prefix>:{<shard>}:due:" (ARGV), as
--   <prefix>:{<shard>}:due:<tier>  ZSET  execution ids scored by due time (microseconds)
-- Every key of a shard carries its hash tag {<shard>}: on a Redis Cluster the caller sends one
-- shard per call, so every key a call touches is in one slot; a single Redis takes many.
-- ARGV[1] is always "now" in microseconds, from the queue's clock (never Redis TIME).

local NOW = tonumber(ARGV[1])

-- Every call moves a shard's version forward, floored at the caller's clock, so a version
-- never goes back even if the shard's keys were lost and rebuilt. The index applies a
-- shard's report only if it is newer than the one it holds. (One SET ... GET: the clock has
-- moved on since the last call, unless another caller's clock runs ahead.)
local function bump_version(version_key)
  local old = tonumber(redis.call('SET', version_key, NOW, 'GET') or '0')
  if old < NOW then
    return NOW
  end
  redis.call('SET', version_key, old + 1)
  return old + 1
end

-- The earliest due time in a tier ("" when the tier is empty); the score as Redis prints it.
local function tier_head(tier_key)
  local first = redis.call('ZRANGE', tier_key, 0, 0, 'WITHSCORES')
  return first[2] or ''
end

-- Drop `tier` from the shard's tier set once its sorted set is empty.
local function forget_tier_if_empty(tiers_key, due_prefix, tier)
  if redis.call('EXISTS', due_prefix .. tier) == 0 then
    redis.call('SREM', tiers_key, tier)
  end
end

-- The report of group g after the call: {version, n, tier_1, head_1, ..., tier_n, head_n}
-- for the tiers in `tiers`: what the index needs to mirror the shard.
local function report(g, due_prefix, tiers)
  local out = {bump_version(KEYS[3 * g]), #tiers}
  for _, tier in ipairs(tiers) do
    out[#out + 1] = tier
    out[#out + 1] = tier_head(due_prefix .. tier)
  end
  return out
end
