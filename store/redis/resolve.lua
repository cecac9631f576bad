#!lua
-- Record a held key as succeeded with a status, without a stored
-- response: an operator's word that its command took effect. KEYS[1]:
-- the entry; on a single server also KEYS[2]: the tenant's index,
-- KEYS[3]: the tenant's held keys and KEYS[4]: the held keys of every
-- tenant. ARGV: the held command's id ('' for any), status, TTL (µs),
-- key, the key's member in KEYS[4] (tenant:key). Judged by Redis's clock. Returns {1, the
-- record's created time (µs), the held key's created time (µs, a
-- string)}, {0} when no live entry is there, or {-1} when the entry is
-- not held or is another command's.
--
-- No flags: a server out of memory refuses the whole script.

-- index: indexfn.lua, which the store puts before this script's code.

local e = redis.call('HMGET', KEYS[1], 's', 'c', 'e', 'ca')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if not e[1] or tonumber(e[3]) <= now then
  return {0}
end
if e[1] ~= 'u' or (ARGV[1] ~= '' and e[2] ~= ARGV[1]) then
  return {-1}
end
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'r', 'st', ARGV[2],
  'ca', string.format('%d', now), 'e', string.format('%d', now + ttl))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(ttl / 1000)))
if KEYS[2] then
  index(KEYS[2], ARGV[4], now, ttl, false)
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('ZREM', KEYS[4], ARGV[5])
end
return {1, now, e[4]}
