-- Reentrant release: one hold fewer for the owner; the field goes at zero, the key with its
-- last field, and then the waiters are told.
-- KEYS[1] = the lock key, ARGV[1] = the owner id, ARGV[2] = the release channel.
-- Returns 1 when a hold was released, 0 when the key is absent, -1 when the key has no field
-- for this owner (another owner's lock: never touched).
-- A key of another type raises WRONGTYPE from HEXISTS: never touched.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return -1
  end
  return 0
end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  if redis.call('HLEN', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], '1')
  end
end
return 1
