#!lua flags=allow-oom
-- Move the end of the lease of the lock held by an owner, even after it
-- ended if no one claimed the key since, and the key's expiry with it
-- (lease + grace). KEYS[1]: the entry; on a single server also KEYS[2]:
-- the tenant's index (see claim.lua), whose longest life grows to cover
-- the renewed lock, so that the index does not trim a lock renewed for
-- longer than any entry lived. ARGV: owner, lease (µs), grace (µs).
-- Judged by Redis's clock. Returns 1, or 0 when the owner holds no
-- lock there. It runs at maxmemory too (allow-oom): it grows nothing (one
-- field keeps a number of the same width, the key already has a TTL),
-- and refusing it would let the lease of a command still running end.
local e = redis.call('HMGET', KEYS[1], 's', 'o', 'ca')
if e[1] ~= 'l' or e[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', string.format('%d', now + lease))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((lease + tonumber(ARGV[3])) / 1000)))
if KEYS[2] and e[3] then
  local life = now + lease + tonumber(ARGV[3]) - tonumber(e[3])
  local longest = -tonumber(redis.call('ZSCORE', KEYS[2], '') or 0)
  if life > longest then
    redis.call('ZADD', KEYS[2], string.format('%d', -life), '')
    redis.call('PEXPIRE', KEYS[2], string.format('%d', math.ceil((life + 60000000) / 1000)))
  end
end
return 1
