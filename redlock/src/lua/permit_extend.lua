-- Extend one permit (after lengthen.lua): extend.lua on the slot key, and the count key
-- kept alive at least as long as the slot (set again where it vanished under our live slot;
-- left alone where another count took over, which can happen only on a node outside our
-- quorum). An absent slot stays absent: set again, it could bring back a permit a release
-- had just removed.
-- KEYS[1] = the slot key, KEYS[2] = the count key; ARGV[1] = our token, ARGV[2] = the new
-- lease in milliseconds, ARGV[3] = our number of permits.
-- Returns 1 when renewed, 0 when the slot is absent, -1 when another owner holds it. Both
-- keys are read first: a WRONGTYPE changes nothing.
local count = redis.call('GET', KEYS[2])
local current = redis.call('GET', KEYS[1])
if current == false then
  return 0
elseif current ~= ARGV[1] then
  return -1
end
lengthen(KEYS[1], ARGV[2])
if count == false then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
elseif count == ARGV[3] then
  lengthen(KEYS[2], ARGV[2])
end
return 1
