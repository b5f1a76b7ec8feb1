-- An administrator's unconditional release: deletes the lock key whoever holds it and tells
-- the waiters. KEYS[1] = the key; ARGV[1] = its release channel. Returns 1 if a key was
-- deleted, 0 if there was none.
local deleted = redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[1], '1')
return deleted
