-- Record which shard holds each id (the look-up `missing` and `remove` start from), and
-- report the ids that were recorded under another shard, so the caller removes that copy.
-- KEYS[b] = <prefix>:{where:<bucket>}:shard  HASH  execution id -> shard; the bucket is
--           crc32(id) mod the bucket count. One bucket per call on a Redis Cluster.
-- ARGV = per key: n, then n times: id, shard
-- Returns {id, old shard, ...} for the ids that moved.
local moved, a = {}, 1
for b = 1, #KEYS do
  local n = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, n do
    local id, shard = ARGV[a], ARGV[a + 1]
    a = a + 2
    local old = redis.call('HGET', KEYS[b], id)
    if old ~= shard then
      if old then
        moved[#moved + 1] = id
        moved[#moved + 1] = old
      end
      redis.call('HSET', KEYS[b], id, shard)
    end
  end
end
return moved
