-- Mirror shard reports in the index. Reports arrive out of order from many processes, so each
-- (tier, shard) head is only replaced by a report of a newer version.
-- KEYS[1] = <prefix>:{index}:tiers          ZSET  tier -> tier: every tier some shard holds
-- KEYS[2] = <prefix>:{index}:head_version   HASH  "<tier>:<shard>" -> version of that head
-- ARGV[1] = "<prefix>:{index}:due:"         head key prefix (ZSET of shards per tier, scored by
--           the earliest due time of that shard's tier, microseconds)
-- ARGV[2..] = reports: shard, version, full ("1": the report lists every tier the shard
--           holds, so any other tier is empty there), n, then n times: tier, head ("" = empty)
local tiers_key, head_version_key, head_prefix = KEYS[1], KEYS[2], ARGV[1]
local listed = {}  -- tiers this call added to KEYS[1] (and has not removed since)

local function set_head(tier, shard, version, head)
  local field = tier .. ':' .. shard
  if version <= tonumber(redis.call('HGET', head_version_key, field) or '-1') then
    return
  end
  redis.call('HSET', head_version_key, field, version)
  local key = head_prefix .. tier
  if head == '' then
    redis.call('ZREM', key, shard)
    if redis.call('EXISTS', key) == 0 then
      redis.call('ZREM', tiers_key, tier)
      listed[tier] = nil
    end
  else
    redis.call('ZADD', key, head, shard)
    if not listed[tier] then
      listed[tier] = true
      redis.call('ZADD', tiers_key, tier, tier)
    end
  end
end

local i = 2
while i <= #ARGV do
  local shard, version, full, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  local seen = {}
  for _ = 1, n do
    seen[ARGV[i]] = true
    set_head(ARGV[i], shard, version, ARGV[i + 1])
    i = i + 2
  end
  if full == '1' then
    for _, tier in ipairs(redis.call('ZRANGE', tiers_key, 0, -1)) do
      if not seen[tier] then
        set_head(tier, shard, version, '')
      end
    end
  end
end
return 1
