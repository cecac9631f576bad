#!lua flags=allow-oom
-- Drop the lock held by an owner. KEYS[1]: the entry; on a single server
-- also KEYS[2]: the tenant's index. ARGV: owner, key. Returns the lock's
-- created time (µs, a string), or 0 when the owner holds no lock there.
--
-- allow-oom: it frees memory, so it runs on a server out of memory too.
local e = redis.call('HMGET', KEYS[1], 's', 'o', 'ca')
if e[1] ~= 'l' or e[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if KEYS[2] then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return e[3]
