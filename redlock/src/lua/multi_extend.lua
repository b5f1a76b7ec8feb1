-- Multi extend (after create_guard.lua): renew every key, only if none is held by another
-- owner; keys that are gone (expired early, lost in a restart) and that nobody took are set
-- again, so a lock that keeps a quorum heals the nodes that forgot it.
-- KEYS = the lock keys, then our tombstone; ARGV[1] = our token, ARGV[2] = the new lease in
-- milliseconds, ARGV[3] = the deadline.
-- Returns 1 when every key held our token and was renewed, 0 when some were absent (and are
-- set again), -1 when another owner holds any key (then nothing changes). Every key is read
-- before any is written, so a key of another type raises WRONGTYPE before anything changed.
local locks = #KEYS - 1
local values = {}
for i = 1, locks do
  values[i] = redis.call('GET', KEYS[i])
  if values[i] ~= false and values[i] ~= ARGV[1] then
    return -1
  end
end
local healed = 0
for i = 1, locks do
  if values[i] == ARGV[1] then
    lengthen(KEYS[i], ARGV[2])
  else
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    healed = 1
  end
end
if healed == 1 then
  return 0
end
return 1
