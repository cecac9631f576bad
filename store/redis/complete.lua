#!lua
-- Turn the lock held by an owner into a record, even after its lease
-- ended if no one claimed the key since. KEYS[1]: the entry; on a single
-- server also KEYS[2]: the tenant's index (see claim.lua). ARGV: owner,
-- status, TTL (µs), responded, truncated, has header, header (JSON), has
-- body, body, key. Returns the record's created time (µs), or 0 when the
-- owner holds no lock there.
--
-- No flags: a server out of memory refuses the whole script.

-- index: indexfn.lua, which the store puts before this script's code.

local e = redis.call('HMGET', KEYS[1], 's', 'o')
if e[1] ~= 'l' or e[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'r', 'st', ARGV[2],
  'ca', string.format('%d', now), 'e', string.format('%d', now + ttl))
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'tr', ARGV[5])
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'h', ARGV[7]) end
  if ARGV[8] == '1' then redis.call('HSET', KEYS[1], 'b', ARGV[9]) end
end
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(ttl / 1000)))
if KEYS[2] then
  index(KEYS[2], ARGV[10], now, ttl, false)
end
return now
