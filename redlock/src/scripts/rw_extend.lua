-- Read-write lock, extend: renews our own share or write grant if it is still live here;
-- never shortens it (a failed extension must leave the old validity backed), never sets a
-- field again where it is gone, never touches another's.
-- KEYS[1] = the lock key, ARGV[1] = our field, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when renewed, 0 when our field is absent, -1 when it is absent and another
-- writer holds the lock.
-- A key of another type (or a hash with foreign fields) raises WRONGTYPE: never touched.

if live[ARGV[1]] == nil then
  if has('w:') then
    return -1
  end
  return 0
end
local expiry = now + tonumber(ARGV[2])
if live[ARGV[1]] < expiry then
  live[ARGV[1]] = expiry
  redis.call('HSET', key, ARGV[1], string.format('%.0f', expiry))
end
settle()
return 1
