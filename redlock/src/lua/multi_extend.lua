-- Multi extend: renew every key, only if none is held by another owner; keys that are gone
-- (expired early, lost in a restart) and that nobody took are set again, so a lock that keeps
-- a quorum heals the nodes that forgot it.
-- KEYS = the lock keys, ARGV[1] = our token, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when every key held our token and was renewed, 0 when some were absent (and are
-- set again), -1 when another owner holds any key (then nothing changes). Every key is read
-- before any is written, so a key of another type raises WRONGTYPE before anything changed.
-- GT: never shortens a key (see extend.lua).
local values = {}
for i, key in ipairs(KEYS) do
  values[i] = redis.call('GET', key)
  if values[i] ~= false and values[i] ~= ARGV[1] then
    return -1
  end
end
local healed = 0
for i, key in ipairs(KEYS) do
  if values[i] == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2], 'GT')
  else
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
    healed = 1
  end
end
if healed == 1 then
  return 0
end
return 1
