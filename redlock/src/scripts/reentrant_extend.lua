-- Reentrant extend: renew the key's lease only if the owner's field exists; never shortens
-- it (the owner's other holds count on their own leases) and never sets anything again.
-- KEYS[1] = the lock key, ARGV[1] = the owner id, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when renewed, 0 when the key is absent, -1 when the key has no field for this
-- owner. A key of another type raises WRONGTYPE from HEXISTS: never touched.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local lease = tonumber(ARGV[2])
  if redis.call('PTTL', KEYS[1]) < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
  end
  return 1
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
return 0
