-- Plain lock, acquire (after create_guard.lua): set the key to our token unless it is held.
-- KEYS[1] = the lock key, then the abandoned tokens' tombstones, then ours; ARGV[1] = our
-- token, ARGV[2] = the lease in milliseconds, then the client's abandoned tokens, then the
-- deadline.
-- Returns nil when set, else the holder's token (ours after a re-sent request): a refusal
-- says who holds the key, which tells a split vote from a holder of a quorum. A key of
-- another type raises WRONGTYPE from GET: never touched.
-- The common case, a free key, is one call.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local current = redis.call('GET', KEYS[1])
if current then
  local abandoned = abandoned_from(3)
  if not abandoned[current] then
    return current
  end
  taken_over(abandoned[current], ARGV[2])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
