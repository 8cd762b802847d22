-- Enqueue into one shard: add each id, or move it (last write wins, one copy kept).
-- KEYS[1] = <prefix>:{<shard>}:items    HASH    execution id -> the tier it is held in
-- KEYS[2] = <prefix>:{<shard>}:tiers    SET     tiers holding at least one id
-- KEYS[3] = <prefix>:{<shard>}:version  STRING  the shard's state version
-- ARGV[1] = "<prefix>:{<shard>}:due:"   tier key prefix; <prefix>:{<shard>}:due:<tier> is a
--           ZSET of execution ids scored by due time (microseconds since the epoch)
-- ARGV[2] = now, microseconds (the queue's clock)
-- ARGV[3..] = id, due, tier; repeated, applied in order
-- Returns the shard report (see shard_common.lua) for every tier the call touched.
local items_key, tiers_key, tier_prefix = KEYS[1], KEYS[2], ARGV[1]
local touched, touched_list = {}, {}
local function touch(tier)
  if not touched[tier] then
    touched[tier] = true
    touched_list[#touched_list + 1] = tier
  end
end
for i = 3, #ARGV, 3 do
  local id, due, tier = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local old = redis.call('HGET', items_key, id)
  if old and old ~= tier then
    redis.call('ZREM', tier_prefix .. old, id)
    forget_tier_if_empty(tiers_key, tier_prefix, old)
    touch(old)
  end
  redis.call('ZADD', tier_prefix .. tier, due, id)
  redis.call('HSET', items_key, id, tier)
  redis.call('SADD', tiers_key, tier)
  touch(tier)
end
local version = bump_version(KEYS[3], tonumber(ARGV[2]))
return report(items_key, version, tier_prefix, touched_list)
