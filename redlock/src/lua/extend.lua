-- Extend (after lengthen.lua): renew the key's expiry only if it still holds our token,
-- never shortening it. A key that is gone stays gone: set again, it could bring back a key
-- a release had just removed (an extension still in flight when the release ran), and a
-- node that lost the key does not count for the hold anyway.
-- KEYS[1] = the lock key; ARGV[1] = our token, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when renewed, 0 when the key is absent, -1 when another owner holds it. A key
-- of another type raises WRONGTYPE from GET: never touched.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  lengthen(KEYS[1], ARGV[2])
  return 1
elseif current == false then
  return 0
end
return -1
