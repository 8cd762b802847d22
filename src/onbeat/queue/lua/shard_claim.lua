-- Claim from one tier of each shard: remove and return up to its limit of due ids, earliest
-- first. Atomic, so an id goes to one caller only.
-- KEYS: three per group (items, tiers, version), see shard_common.lua
-- ARGV[1] = now, microseconds (the queue's clock; only for the version)
-- ARGV[2..] = per group: due prefix, tier, limit (>= 1), due_by (microseconds: due means
--             score <= due_by; now plus the claim's "ahead", so a worker may take ids early)
-- Returns one report per group for its tier (see shard_common.lua), the claimed ids appended.
local reports = {}
for g = 1, #KEYS / 3 do
  local items_key, tiers_key = KEYS[3 * g - 2], KEYS[3 * g - 1]
  local due_prefix, tier = ARGV[4 * g - 2], ARGV[4 * g - 1]
  local limit, due_by = tonumber(ARGV[4 * g]), ARGV[4 * g + 1]
  local tier_key = due_prefix .. tier
  local ids = redis.call('ZRANGEBYSCORE', tier_key, '-inf', due_by, 'LIMIT', 0, limit)
  for i = 1, #ids, 500 do
    local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
    redis.call('ZREM', tier_key, unpack(chunk))
    redis.call('HDEL', items_key, unpack(chunk))
  end
  forget_tier_if_empty(tiers_key, due_prefix, tier)
  local out = report(g, due_prefix, {tier})
  for _, id in ipairs(ids) do
    out[#out + 1] = id
  end
  reports[g] = out
end
return reports
