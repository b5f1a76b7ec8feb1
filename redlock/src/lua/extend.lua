-- Extend (after create_guard.lua): renew the key's expiry only if it still holds our token;
-- where the key is gone (expired early, or lost in a node restart) and nobody else took it,
-- set it again, so a lock that keeps a quorum heals the nodes that forgot it.
-- KEYS[1] = the lock key, KEYS[2] = our tombstone; ARGV[1] = our token, ARGV[2] = the new
-- lease in milliseconds, ARGV[3] = the deadline.
-- Returns 1 when renewed, 0 when the key was absent (and is set again), -1 when another
-- owner holds it. A key of another type raises WRONGTYPE from GET: never touched.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  lengthen(KEYS[1], ARGV[2])
  return 1
elseif current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
return -1
