-- Plain lock, acquire: set the key to our token unless it is held.
-- KEYS[1] = the lock key; ARGV[1] = our token, ARGV[2] = the lease in milliseconds.
-- Returns nil when set, else the holder's token (ours after a re-sent request): a refusal
-- says who holds the key, which tells a split vote from a holder of a quorum. A key of
-- another type raises WRONGTYPE from GET: never touched.
-- The common case, a free key, is one call.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
