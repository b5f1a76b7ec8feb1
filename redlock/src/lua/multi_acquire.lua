-- Multi acquire: all keys or none, on this node.
-- KEYS = the lock keys; ARGV[1] = our token, ARGV[2] = the lease in milliseconds.
-- Returns 1 when every key now holds our token, -1 when another owner holds any of them
-- (then nothing is set). Every key is read before any is written, so a key of another type
-- raises WRONGTYPE from GET before anything changed.
for i = 1, #KEYS do
  local current = redis.call('GET', KEYS[i])
  -- Our own token: an earlier send of this very attempt landed.
  if current ~= false and current ~= ARGV[1] then
    return -1
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
