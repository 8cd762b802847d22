-- Report the whole state of one shard (every tier it holds), for the index's repair pass.
-- KEYS[1] = <prefix>:{<shard>}:items    HASH    execution id -> the tier it is held in
-- KEYS[2] = <prefix>:{<shard>}:tiers    SET     tiers holding at least one id
-- KEYS[3] = <prefix>:{<shard>}:version  STRING  the shard's state version
-- ARGV[1] = "<prefix>:{<shard>}:due:"   tier key prefix (ZSET per tier, scored by due time)
-- ARGV[2] = now, microseconds (the queue's clock)
-- Returns the shard report (see shard_common.lua) for every tier the shard holds; the index
-- treats tiers missing from it as empty.
local version = bump_version(KEYS[3], tonumber(ARGV[2]))
return report(KEYS[1], version, ARGV[1], redis.call('SMEMBERS', KEYS[2]))
