#!lua
-- Index an entry of a cluster, after the script that claimed or completed
-- it on its own node (the index is in another slot). KEYS[1]: the
-- tenant's index (see claim.lua). ARGV: key, the entry's created time
-- (µs), its life (µs). An index update that arrives after a newer one of
-- the same key changes nothing.
--
-- No flags: a server out of memory refuses it, as it refuses the claim.
local idx, created, life = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local longest = -tonumber(redis.call('ZSCORE', idx, '') or 0)
if life > longest then
  longest = life
  redis.call('ZADD', idx, string.format('%d', -longest), '')
end
local keep = longest + 60000000
redis.call('ZADD', idx, 'GT', ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', idx, '0', string.format('(%d', created - keep))
redis.call('PEXPIRE', idx, string.format('%d', math.ceil(keep / 1000)))
return 1
