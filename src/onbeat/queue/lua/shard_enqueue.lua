-- Enqueue into shards: add each id, or move it within its shard (last write wins).
-- KEYS: three per group (items, tiers, version), see shard_common.lua
-- ARGV[1] = now, microseconds
-- ARGV[2..] = per group: due prefix, n, then n times: id, due (microseconds), tier
-- Returns one report per group (see shard_common.lua) covering every tier it touched.
local reports, a = {}, 2
for g = 1, #KEYS / 3 do
  local items_key, tiers_key = KEYS[3 * g - 2], KEYS[3 * g - 1]
  local due_prefix, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local touched, touched_list, listed = {}, {}, {}
  for _ = 1, n do
    local id, due, tier = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    a = a + 3
    local old = redis.call('HGET', items_key, id)
    if old ~= tier then
      if old then
        redis.call('ZREM', due_prefix .. old, id)
        forget_tier_if_empty(tiers_key, due_prefix, old)
        if not touched[old] then
          touched[old] = true
          touched_list[#touched_list + 1] = old
        end
      end
      redis.call('HSET', items_key, id, tier)
    end
    redis.call('ZADD', due_prefix .. tier, due, id)
    if not listed[tier] then  -- once per tier: ids are unique in a call, so none empties it
      listed[tier] = true
      redis.call('SADD', tiers_key, tier)
    end
    if not touched[tier] then
      touched[tier] = true
      touched_list[#touched_list + 1] = tier
    end
  end
  reports[g] = report(g, due_prefix, touched_list)
end
return reports
