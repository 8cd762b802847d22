-- Helpers prepended (at load time) to every shard_*.lua script; not a script of its own.
-- A shard's keys all carry the hash tag {<shard>}, and tier keys are built from ARGV[1]
-- ("<prefix>:{<shard>}:due:"), so every key a shard script touches hashes to the slot of
-- its KEYS: a Redis Cluster runs it on one node.

-- Every call moves the shard's version forward, floored at the caller's clock (ARGV[2],
-- microseconds), so a version never goes back even if the shard's keys were lost and
-- rebuilt. The index applies a shard's report only if it is newer than the one it holds.
local function bump_version(version_key, now)
  local version = tonumber(redis.call('GET', version_key) or '0') + 1
  if now > version then
    version = now
  end
  redis.call('SET', version_key, version)
  return version
end

-- The earliest due time in a tier ("" when the tier is empty); the score as Redis prints it.
local function tier_head(tier_key)
  local first = redis.call('ZRANGE', tier_key, 0, 0, 'WITHSCORES')
  return first[2] or ''
end

-- {version, ids held, n, tier_1, head_1, ..., tier_n, head_n}: what the index needs to mirror
-- this shard, for the tiers in `tiers` (a list of tier strings).
local function report(items_key, version, tier_prefix, tiers)
  local out = {version, redis.call('HLEN', items_key), #tiers}
  for _, tier in ipairs(tiers) do
    out[#out + 1] = tier
    out[#out + 1] = tier_head(tier_prefix .. tier)
  end
  return out
end

-- Drop `tier` from the shard's tier set once its sorted set is empty.
local function forget_tier_if_empty(tiers_key, tier_prefix, tier)
  if redis.call('EXISTS', tier_prefix .. tier) == 0 then
    redis.call('SREM', tiers_key, tier)
  end
end
