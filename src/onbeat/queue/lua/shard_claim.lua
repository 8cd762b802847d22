-- Claim from one tier of one shard: remove and return up to `limit` due ids, earliest first.
-- Atomic, so an id goes to one caller only.
-- KEYS[1] = <prefix>:{<shard>}:items    HASH    execution id -> the tier it is held in
-- KEYS[2] = <prefix>:{<shard>}:tiers    SET     tiers holding at least one id
-- KEYS[3] = <prefix>:{<shard>}:version  STRING  the shard's state version
-- ARGV[1] = "<prefix>:{<shard>}:due:"   tier key prefix (ZSET per tier, scored by due time)
-- ARGV[2] = now, microseconds (the queue's clock, never Redis TIME: tests drive it)
-- ARGV[3] = tier
-- ARGV[4] = limit (>= 1)
-- Returns the shard report for the tier (see shard_common.lua), then the claimed ids.
local items_key, tiers_key, tier_prefix, tier = KEYS[1], KEYS[2], ARGV[1], ARGV[3]
local tier_key = tier_prefix .. tier
local ids = redis.call('ZRANGEBYSCORE', tier_key, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[4]))
for i = 1, #ids, 500 do
  local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
  redis.call('ZREM', tier_key, unpack(chunk))
  redis.call('HDEL', items_key, unpack(chunk))
end
forget_tier_if_empty(tiers_key, tier_prefix, tier)
local version = bump_version(KEYS[3], tonumber(ARGV[2]))
local out = report(items_key, version, tier_prefix, {tier})
for _, id in ipairs(ids) do
  out[#out + 1] = id
end
return out
