-- Before ids are written to their shards: make sure the index will find them. Lowers each
-- (tier, shard) head to at most the given due time and registers the shard, so that a writer
-- that dies between its shard write and its index update leaves the index early (a claimer
-- visits, finds the truth and corrects it), never late.
-- KEYS[1] = <prefix>:{index}:tiers      ZSET  tier -> tier: every tier some shard holds
-- KEYS[2] = <prefix>:{index}:shards     SET   every shard ever used (repair and size walk it)
-- ARGV[1] = "<prefix>:{index}:due:"     head key prefix; <prefix>:{index}:due:<tier> is a ZSET
--           of shards scored by the earliest due time (microseconds) of that shard's tier
-- ARGV[2..] = tier, shard, due; repeated
local tiers, shards = {}, {}
for i = 2, #ARGV, 3 do
  local tier, shard, due = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('ZADD', ARGV[1] .. tier, 'LT', due, shard)
  if not tiers[tier] then
    tiers[tier] = true
    redis.call('ZADD', KEYS[1], tier, tier)
  end
  if not shards[shard] then
    shards[shard] = true
    redis.call('SADD', KEYS[2], shard)
  end
end
return #ARGV
