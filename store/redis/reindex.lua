#!lua flags=allow-oom
-- Move a key of a tenant's index, or drop it, if it is still where the
-- caller saw it: for entries released or deleted on a cluster, and for
-- those the admin listing finds ended or created at another time than
-- their index says. KEYS[1]: the index. ARGV: key, its score seen (µs),
-- the new score (µs), or '' to drop it. Returns 1 when it changed the
-- index.
--
-- allow-oom: it frees memory or moves a member, so it runs on a server out
-- of memory too.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
