#!lua flags=allow-oom
-- Delete an entry, live or ended. KEYS[1]: the entry; on a single server
-- also KEYS[2]: the tenant's index, KEYS[3]: its held keys and KEYS[4]:
-- the held keys of every tenant. ARGV: key, its member in KEYS[4]
-- (tenant:key). Returns the entry's created time (µs, a string), or 0
-- when there is none.
--
-- allow-oom: it frees memory, so it runs on a server out of memory too.
local created = redis.call('HGET', KEYS[1], 'ca')
if not created then
  return 0
end
redis.call('DEL', KEYS[1])
if KEYS[2] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
return created
