-- The function index, which the scripts that index an entry share: the
-- store puts this file after the first line (#!lua and its flags) of each
-- of them (withIndexFn).

-- index puts member at score created (µs) in the tenant's index idx, a
-- sorted set of its keys by creation time that the admin listing pages
-- through. Its member '' (the store indexes no empty key) holds, as a
-- negative score, the longest life (µs) of an entry indexed there: keys
-- older than that, and a minute for the clocks of a cluster's nodes, are
-- of ended entries and are trimmed when trim is set, and the index
-- outlives its newest entry by as long. With onlyNewer, a member already
-- at a later time stays there (a cluster's index update that arrives
-- after a newer one of the same key).
local function index(idx, member, created, life, trim, onlyNewer)
  local longest = -tonumber(redis.call('ZSCORE', idx, '') or 0)
  if life > longest then
    longest = life
    redis.call('ZADD', idx, string.format('%d', -longest), '')
  end
  local keep = longest + 60000000
  if onlyNewer then
    redis.call('ZADD', idx, 'GT', string.format('%d', created), member)
  else
    redis.call('ZADD', idx, string.format('%d', created), member)
  end
  if trim then
    redis.call('ZREMRANGEBYSCORE', idx, '0', string.format('(%d', created - keep))
  end
  redis.call('PEXPIRE', idx, string.format('%d', math.ceil(keep / 1000)))
end
