-- Remove ids from shards, whatever tier holds them; ids a shard does not hold are ignored.
-- KEYS: three per group (items, tiers, version), see shard_common.lua
-- ARGV[1] = now, microseconds
-- ARGV[2..] = per group: due prefix, n, then n execution ids
-- Returns one report per group (see shard_common.lua) covering every tier it touched.
local reports, a = {}, 2
for g = 1, #KEYS / 3 do
  local items_key, tiers_key = KEYS[3 * g - 2], KEYS[3 * g - 1]
  local due_prefix, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local touched, touched_list = {}, {}
  for _ = 1, n do
    local id = ARGV[a]
    a = a + 1
    local tier = redis.call('HGET', items_key, id)
    if tier then
      redis.call('ZREM', due_prefix .. tier, id)
      redis.call('HDEL', items_key, id)
      if not touched[tier] then
        touched[tier] = true
        touched_list[#touched_list + 1] = tier
      end
    end
  end
  for _, tier in ipairs(touched_list) do
    forget_tier_if_empty(tiers_key, due_prefix, tier)
  end
  reports[g] = report(g, due_prefix, touched_list)
end
return reports
