-- Multi acquire (after create_guard.lua): all keys or none, on this node.
-- KEYS = the lock keys, then the abandoned tokens' tombstones, then ours; ARGV[1] = our
-- token, ARGV[2] = the lease in milliseconds, then the client's abandoned tokens, then the
-- deadline.
-- Returns 1 when every key now holds our token, -1 when another owner holds any of them
-- (then nothing is set). Every key is read before any is written, so a key of another type
-- raises WRONGTYPE from GET before anything changed.
local abandoned, count = abandoned_from(3)
local locks = #KEYS - 1 - count
local taken = {}
for i = 1, locks do
  local current = redis.call('GET', KEYS[i])
  -- Our own token: an earlier send of this very attempt landed.
  if current ~= false and current ~= ARGV[1] then
    if not abandoned[current] then
      return -1
    end
    taken[current] = abandoned[current]
  end
end
for _, tombstone in pairs(taken) do
  taken_over(tombstone, ARGV[2])
end
for i = 1, locks do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
