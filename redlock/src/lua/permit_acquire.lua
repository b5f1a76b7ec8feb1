-- Acquire one permit slot of a counting lock (after lengthen.lua): the slot is a plain lock key (key = token), and
-- the count key next to it (same hash slot) records how many permits the resource has.
-- KEYS[1] = the slot key, KEYS[2] = the count key; ARGV[1] = our token, ARGV[2] = the lease
-- in milliseconds, ARGV[3] = the number of permits this client asks with.
-- Returns nil when set, the holder's token (ours after a re-sent request) when the slot is
-- held, and an integer, the count the node has recorded (0 if unreadable), when it differs
-- from ours: nothing is changed then. Everything is read before anything is written, so a
-- WRONGTYPE aborts the script with nothing changed.
-- The count key lives at least as long as every slot granted with it on this node (its
-- expiry only grows), so two counts can never both be granted on a quorum at once.
local count = redis.call('GET', KEYS[2])
if count and count ~= ARGV[3] then
  return tonumber(count) or 0
end
local current = redis.call('GET', KEYS[1])
if current then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if count then
  lengthen(KEYS[2], ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
return false
