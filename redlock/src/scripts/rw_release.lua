-- Read-write lock, release: removes our own share or write grant (and, for a writer, its
-- intent), never another's; when the lock becomes free of shares and writers, waiters are
-- told on the release channel.
-- KEYS[1] = the lock key, ARGV[1] = our field ('r:<token>', 'w:<token>', or '' to withdraw
-- an intent alone), ARGV[2] = the release channel, ARGV[3] = our intent field or ''.
-- Returns 1 when our field was removed, 0 when it was absent (expired, or never set here),
-- -1 when it was absent and another writer holds the lock.
-- A key of another type (or a hash with foreign fields) raises WRONGTYPE: never touched.

local changed = false
local result = 0
if ARGV[3] ~= '' and live[ARGV[3]] ~= nil then
  live[ARGV[3]] = nil
  redis.call('HDEL', key, ARGV[3])
  changed = true
end
if ARGV[1] ~= '' and live[ARGV[1]] ~= nil then
  live[ARGV[1]] = nil
  redis.call('HDEL', key, ARGV[1])
  changed = true
  result = 1
elseif has('w:') then
  result = -1
end
if changed then
  settle()
  if not has('r:') and not has('w:') then
    redis.call('PUBLISH', ARGV[2], '1')
  end
end
return result
