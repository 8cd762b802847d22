-- The earliest due time held in any tier of any shard, or nil when the queue is empty.
-- KEYS[1] = <prefix>:{index}:tiers      ZSET  tier -> tier: every tier some shard holds
-- ARGV[1] = "<prefix>:{index}:due:"     head key prefix (ZSET of shards per tier, scored by
--           the earliest due time of that shard's tier, microseconds)
-- Returns the due time as Redis prints the score, or nil.
local best, best_text = nil, false
for _, tier in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local first = redis.call('ZRANGE', ARGV[1] .. tier, 0, 0, 'WITHSCORES')
  if first[2] and (best == nil or tonumber(first[2]) < best) then
    best, best_text = tonumber(first[2]), first[2]
  end
end
return best_text
