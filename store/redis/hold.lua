#!lua
-- Turn the lock held by an owner into a held key (outcome unknown), even
-- after its lease ended if no one claimed the key since: state 'u', no
-- owner, no lease, kept until its expiry. KEYS[1]: the entry; on a single
-- server also KEYS[2]: the tenant's index, KEYS[3]: the tenant's held
-- keys and KEYS[4]: the held keys of every tenant (see index below; on a
-- cluster the store indexes the key after this script, with index.lua).
-- ARGV: owner, TTL (µs), key, the key's member in KEYS[4] (tenant:key).
-- Judged by Redis's clock. Returns the entry's created time (µs, a
-- string), or 0 when the owner holds no lock there.
--
-- No flags: a server out of memory refuses the whole script; the lock
-- then lives out its lease, and the store's caller says so.

-- index: indexfn.lua, which the store puts before this script's code.

local e = redis.call('HMGET', KEYS[1], 's', 'o', 'ca')
if e[1] ~= 'l' or e[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 's', 'u', 'e', string.format('%d', now + ttl))
redis.call('HDEL', KEYS[1], 'o')
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(ttl / 1000)))
if KEYS[2] then
  local created = tonumber(e[3])
  index(KEYS[2], ARGV[3], created, now + ttl - created, false)
  index(KEYS[3], ARGV[3], created, now + ttl - created, false)
  index(KEYS[4], ARGV[4], created, now + ttl - created, true)
end
return e[3]
