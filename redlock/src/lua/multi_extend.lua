-- Multi extend (after lengthen.lua): renew every key, only if every one still holds our
-- token; a node where any is gone (expired early, lost in a restart, released) no longer
-- holds the set, and nothing is set again there: it could bring back keys a release had
-- just removed.
-- KEYS = the lock keys; ARGV[1] = our token, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when every key held our token and was renewed, 0 when some were absent (then
-- nothing changes), -1 when another owner holds any key (then nothing changes). Every key
-- is read before any is written, so a key of another type raises WRONGTYPE before anything
-- changed.
local locks = #KEYS
local absent = false
for i = 1, locks do
  local value = redis.call('GET', KEYS[i])
  if value == false then
    absent = true
  elseif value ~= ARGV[1] then
    return -1
  end
end
if absent then
  return 0
end
for i = 1, locks do
  lengthen(KEYS[i], ARGV[2])
end
return 1
