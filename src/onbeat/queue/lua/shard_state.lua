-- Report the whole state of shards (every tier each holds), for the index's repair pass.
-- KEYS: three per group (items, tiers, version), see shard_common.lua
-- ARGV[1] = now, microseconds
-- ARGV[2..] = per group: due prefix
-- Returns one report per group (see shard_common.lua) for every tier the shard holds; the
-- index treats tiers missing from it as empty there.
local reports = {}
for g = 1, #KEYS / 3 do
  reports[g] = report(g, ARGV[g + 1], redis.call('SMEMBERS', KEYS[3 * g - 1]))
end
return reports
