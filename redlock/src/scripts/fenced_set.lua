-- A fenced write on the protected resource: SET KEYS[1] ARGV[1] only if the fencing token
-- ARGV[2] is at least the highest token seen for it (kept in KEYS[2]).
-- Returns 1 when written, 0 when rejected as stale.
local seen = tonumber(redis.call('GET', KEYS[2]) or '-1')
local token = tonumber(ARGV[2])
if token < seen then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
