-- Drop the lock held by an owner. KEYS[1]: the entry. ARGV: owner.
-- Returns 1, or 0 when the owner holds no lock there.
local e = redis.call('HMGET', KEYS[1], 's', 'o')
if e[1] ~= 'l' or e[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
