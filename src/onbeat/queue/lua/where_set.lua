-- Record which shard holds each id (the look-up `missing` and `remove` start from), and
-- report the ids that were recorded under another shard, so the caller removes that copy.
-- KEYS[1] = <prefix>:{where:<bucket>}:shard  HASH  execution id -> shard; the bucket is
--           crc32(id) mod the bucket count, so the look-up spreads over a few slots
-- ARGV = id, shard; repeated
-- Returns {id, old shard, ...} for the ids that moved.
local moved = {}
for i = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old and old ~= ARGV[i + 1] then
    moved[#moved + 1] = ARGV[i]
    moved[#moved + 1] = old
  end
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return moved
