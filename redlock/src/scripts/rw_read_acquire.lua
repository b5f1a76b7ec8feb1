-- Read-write lock, reader acquire: one more share, unless a writer holds the lock or waits
-- for it (a live intent field: writer preference).
-- KEYS[1] = the lock key (a hash: 'r:<token>' and 'w:<token>' = share / write grant expiry,
-- 'i:<id>' = a waiting writer's intent expiry, all in server milliseconds),
-- ARGV[1] = our field ('r:<token>'), ARGV[2] = the lease in milliseconds.
-- Returns 1 when the share is set, -1 when a writer holds the lock, -2 when a writer waits.
-- A key of another type (or a hash with foreign fields) raises WRONGTYPE: never touched.

if has('w:') then
  return -1
end
if has('i:') then
  return -2
end
local expiry = now + tonumber(ARGV[2])
-- A share retried under the same token is never shortened.
if live[ARGV[1]] == nil or live[ARGV[1]] < expiry then
  live[ARGV[1]] = expiry
  redis.call('HSET', key, ARGV[1], string.format('%.0f', expiry))
end
settle()
return 1
