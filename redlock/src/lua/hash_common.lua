-- The common part of every script of a hash-based lock (reentrant, read-write), put after
-- the kind's header (`*_fields.lua`, which defines KIND, FIELD_KINDS and conflicts) by the
-- script registry (command.rs): Lua scripts cannot include each other.
--
-- One hash per lock; every field is one hold with its own expiry as its value, in the
-- node's milliseconds (TIME: Redis 7.0 has no per-field TTL). This reads the hash, refuses a
-- key that is not this kind's lock before writing anything, drops the fields whose expiry
-- has passed, and defines the helpers the operations use.
local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local raw = redis.call('HGETALL', key)
for i = 1, #raw, 2 do
  if tonumber(raw[i + 1]) == nil or not FIELD_KINDS[string.sub(raw[i], 1, 2)] then
    return redis.error_reply('WRONGTYPE the key is a hash but not a ' .. KIND)
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
-- The key lives exactly as long as its longest-lived field: never shorter than any hold.
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
-- Whether a live field other than `mine` conflicts with it.
local function conflicting(mine)
  for field in pairs(live) do
    if field ~= mine and conflicts(mine, field) then return true end
  end
  return false
end
-- Whether a live field of the given two-character kind exists, other than `except`.
local function has(prefix, except)
  for field in pairs(live) do
    if string.sub(field, 1, 2) == prefix and field ~= except then return true end
  end
  return false
end
-- Sets `field` to expire `ms` from now, never shortening it (a hold retried under its own
-- token, or an extension that lost a race, must not cut a lease short).
local function hold(field, ms)
  local expiry = now + tonumber(ms)
  if live[field] == nil or live[field] < expiry then
    live[field] = expiry
    redis.call('HSET', key, field, string.format('%.0f', expiry))
  end
end
