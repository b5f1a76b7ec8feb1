-- Reentrant acquire: one more hold for the owner, if nobody else holds the lock.
-- KEYS[1] = the lock key (a hash: field = owner id, value = hold count),
-- ARGV[1] = the owner id, ARGV[2] = the lease in milliseconds.
-- Returns the owner's new hold count (>= 1), or -1 when another owner holds the key.
-- A key of another type raises WRONGTYPE from HEXISTS: never touched.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
-- Absent key: this restores the owner's field (a node that restarted empty or missed holds).
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if count < 1 then
  -- A count driven to zero or below by hand: this hold is the one we know of.
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  count = 1
end
-- Never shorten the key's lease: the owner's other holds count on theirs.
local lease = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return count
