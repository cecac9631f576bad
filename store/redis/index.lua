#!lua
-- Index an entry of a cluster, after the script that claimed or completed
-- it on its own node (the index is in another slot). KEYS[1]: the
-- tenant's index (see claim.lua). ARGV: key, the entry's created time
-- (µs), its life (µs). An index update that arrives after a newer one of
-- the same key changes nothing.
--
-- No flags: a server out of memory refuses it, as it refuses the claim.
index(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), true, true)
return 1
