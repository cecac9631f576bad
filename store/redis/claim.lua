#!lua
-- Claim (tenant, key) for a new command, or report the live entry there.
-- KEYS[1]: the entry; on a single server also KEYS[2]: the tenant's index
-- (see index below; on a cluster the store indexes the entry after this
-- script, with index.lua). ARGV: owner, command id, command type,
-- fingerprint, lease (µs), grace (µs), key. Judged by Redis's clock. Returns {1, now} when claimed, else {0, now,
-- state, command id, command type, fingerprint, created, ends, status,
-- header, body, truncated}.
--
-- No flags: a server out of memory refuses the whole script before it
-- runs, so a lock whose lease ended is not taken over (the DEL of the old
-- entry would otherwise make room for the new lock) any more than a new
-- key is claimed.

-- index: indexfn.lua, which the store puts before this script's code.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local e = redis.call('HMGET', KEYS[1], 's', 'c', 't', 'f', 'ca', 'e', 'st', 'h', 'b', 'tr', 'o')
if e[1] then
  -- A live entry stays, unless it is this owner's own lock: a claim
  -- resent after its reply was lost is the same claim.
  if tonumber(e[6]) > now and not (e[1] == 'l' and e[11] == ARGV[1]) then
    return {0, now, e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10]}
  end
  redis.call('DEL', KEYS[1])
end
local lease = tonumber(ARGV[5])
local life = lease + tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 's', 'l', 'o', ARGV[1], 'c', ARGV[2], 't', ARGV[3], 'f', ARGV[4],
  'ca', string.format('%d', now), 'e', string.format('%d', now + lease))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(life / 1000)))
if KEYS[2] then
  index(KEYS[2], ARGV[7], now, life, true)
end
return {1, now}
