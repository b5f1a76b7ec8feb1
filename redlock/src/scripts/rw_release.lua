-- Read-write lock, release: removes our own share or write grant (and, for a writer, its
-- intent), never another's; when the lock becomes free of shares and writers, waiters are
-- told on the release channel.
-- KEYS[1] = the lock key, ARGV[1] = our field ('r:<token>', 'w:<token>', or '' to withdraw
-- an intent alone), ARGV[2] = the release channel, ARGV[3] = our intent field or ''.
-- Returns 1 when our field was removed, 0 when it was absent (expired, or never set here),
-- -1 when it was absent and another writer holds the lock.
-- A key of another type (or a hash with foreign fields) raises WRONGTYPE: never touched.
-- Common part (every rw_*.lua starts with it; scripts cannot include each other):
-- reads the hash, refuses a key that is not a read-write lock before writing anything, then
-- drops the fields whose expiry (server milliseconds, from TIME) has passed.
local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local raw = redis.call('HGETALL', key)
for i = 1, #raw, 2 do
  local kind = string.sub(raw[i], 1, 2)
  if tonumber(raw[i + 1]) == nil or (kind ~= 'r:' and kind ~= 'w:' and kind ~= 'i:') then
    return redis.error_reply('WRONGTYPE the key is a hash but not a read-write lock')
  end
end
-- field -> expiry, for the live fields only.
local live = {}
for i = 1, #raw, 2 do
  local expiry = tonumber(raw[i + 1])
  if expiry <= now then
    redis.call('HDEL', key, raw[i])
  else
    live[raw[i]] = expiry
  end
end
-- The key lives exactly as long as its longest-lived field: never shorter than any share.
local function settle()
  local latest = 0
  for _, expiry in pairs(live) do
    if expiry > latest then latest = expiry end
  end
  if latest > 0 then
    redis.call('PEXPIREAT', key, string.format('%.0f', latest))
  else
    redis.call('DEL', key)
  end
end
local function has(prefix, except)
  for field in pairs(live) do
    if string.sub(field, 1, 2) == prefix and field ~= except then return true end
  end
  return false
end
-- End of the common part.

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
