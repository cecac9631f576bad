#!lua
-- Index an entry of a cluster, after the script that claimed or completed
-- it on its own node (the index is in another slot). KEYS[1], KEYS[2]: the
-- tenant's index and its longest life (see claim.lua). ARGV: key, the
-- entry's created time (µs), its life (µs). An index update that arrives
-- after a newer one of the same key changes nothing.
--
-- No flags: a server out of memory refuses it, as it refuses the claim.
local longest = math.max(tonumber(redis.call('GET', KEYS[2]) or 0), tonumber(ARGV[3]))
local created = tonumber(ARGV[2])
local keep = longest + 60000000
local ms = string.format('%d', math.ceil(keep / 1000))
redis.call('SET', KEYS[2], string.format('%d', longest), 'PX', ms)
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', created - keep))
redis.call('PEXPIRE', KEYS[1], ms)
return 1
