#!lua
-- Does nothing. No flags: a server out of memory refuses it as it refuses
-- claims and completions, so Ping can tell.
return 1
