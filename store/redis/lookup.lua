#!lua flags=no-writes
-- The live lock or record, judged by Redis's clock. KEYS[1]: the entry.
-- Returns {now, state, command id, command type, fingerprint, created,
-- ends, status, header, body, truncated}, or nil.
--
-- no-writes: it runs on a server out of memory too.
local e = redis.call('HMGET', KEYS[1], 's', 'c', 't', 'f', 'ca', 'e', 'st', 'h', 'b', 'tr')
if not e[1] then
  return nil
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if tonumber(e[6]) <= now then
  return nil
end
return {now, e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10]}
