-- Extend one permit (after create_guard.lua): extend.lua on the slot key, and the count key kept alive at least as
-- long as the slot (set again where it vanished; left alone where another count took over,
-- which can happen only on a node outside our quorum).
-- KEYS[1] = the slot key, KEYS[2] = the count key, KEYS[3] = our tombstone; ARGV[1] = our
-- token, ARGV[2] = the new lease in milliseconds, ARGV[3] = our number of permits, ARGV[4] =
-- the deadline.
-- Returns 1 when renewed, 0 when the slot was absent (and is set again), -1 when another
-- owner holds it. Both keys are read first: a WRONGTYPE changes nothing.
local count = redis.call('GET', KEYS[2])
local current = redis.call('GET', KEYS[1])
local result
if current == ARGV[1] then
  lengthen(KEYS[1], ARGV[2])
  result = 1
elseif current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  result = 0
else
  return -1
end
if count == false then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
elseif count == ARGV[3] then
  lengthen(KEYS[2], ARGV[2])
end
return result
