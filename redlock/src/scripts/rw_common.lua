-- The common part of every read-write lock script, put before each of them by the
-- `scripts!` registry (script.rs): Lua scripts cannot include each other. It reads the hash, refuses a key that is not a read-write lock before writing anything, then
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
