-- Turn the lock held by an owner into a record, even after its lease
-- ended if no one claimed the key since. KEYS[1]: the entry. ARGV: owner,
-- status, TTL (µs), responded, truncated, has header, header (JSON), has
-- body, body. Returns 1, or 0 when the owner holds no lock there.
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
return 1
