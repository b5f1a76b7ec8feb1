-- Fenced acquire: SET NX PX, and on a grant bump the resource's fencing counter.
-- KEYS[1] = the lock key, KEYS[2] = its fencing counter; ARGV[1] = our token, ARGV[2] = ttl ms.
-- Returns {1, counter} when granted (or already ours), {0, holder} when held by another
-- owner. A lock key or counter of another type raises WRONGTYPE: never touched.
local current = redis.call('GET', KEYS[1])
if current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
elseif current == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, current}
