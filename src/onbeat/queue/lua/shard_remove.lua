-- Remove ids from one shard, whatever tier holds them; unknown ids are ignored.
-- KEYS[1] = <prefix>:{<shard>}:items    HASH    execution id -> the tier it is held in
-- KEYS[2] = <prefix>:{<shard>}:tiers    SET     tiers holding at least one id
-- KEYS[3] = <prefix>:{<shard>}:version  STRING  the shard's state version
-- ARGV[1] = "<prefix>:{<shard>}:due:"   tier key prefix (ZSET per tier, scored by due time)
-- ARGV[2] = now, microseconds (the queue's clock)
-- ARGV[3..] = execution ids
-- Returns the shard report (see shard_common.lua) for every tier the call touched.
local items_key, tiers_key, tier_prefix = KEYS[1], KEYS[2], ARGV[1]
local touched, touched_list = {}, {}
for i = 3, #ARGV do
  local tier = redis.call('HGET', items_key, ARGV[i])
  if tier then
    redis.call('ZREM', tier_prefix .. tier, ARGV[i])
    redis.call('HDEL', items_key, ARGV[i])
    if not touched[tier] then
      touched[tier] = true
      touched_list[#touched_list + 1] = tier
    end
  end
end
for _, tier in ipairs(touched_list) do
  forget_tier_if_empty(tiers_key, tier_prefix, tier)
end
local version = bump_version(KEYS[3], tonumber(ARGV[2]))
return report(items_key, version, tier_prefix, touched_list)
