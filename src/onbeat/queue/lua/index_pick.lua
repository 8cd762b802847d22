-- Which shards to claim from: the (tier, shard) pairs whose head is due, highest tier first,
-- then earliest head first.
-- KEYS[1] = <prefix>:{index}:tiers      ZSET  tier -> tier: every tier some shard holds
-- ARGV[1] = "<prefix>:{index}:due:"     head key prefix (ZSET of shards per tier, scored by
--           the earliest due time of that shard's tier, microseconds)
-- ARGV[2] = until, microseconds (the queue's clock, plus the claim's "ahead"): a head due by
--           then is due
-- ARGV[3] = at most this many pairs
-- Returns {tier_1, shard_1, tier_2, shard_2, ...}.
local out, most = {}, tonumber(ARGV[3])
for _, tier in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, -1)) do
  local room = most - #out / 2
  if room <= 0 then
    break
  end
  local shards = redis.call('ZRANGEBYSCORE', ARGV[1] .. tier, '-inf', ARGV[2], 'LIMIT', 0, room)
  for _, shard in ipairs(shards) do
    out[#out + 1] = tier
    out[#out + 1] = shard
  end
end
return out
