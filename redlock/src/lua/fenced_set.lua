-- A fenced write on the protected resource: SET KEYS[1] ARGV[1] only if the fencing token
-- ARGV[2] is at least the highest token seen for it (kept in KEYS[2]).
-- Tokens are compared as digit strings, never as Lua numbers (doubles lose integers above
-- 2^53). Returns 1 when written, 0 when rejected as stale; a token or a stored value that is
-- not a decimal number is an error, and nothing is written.
local token = ARGV[2]
if not string.match(token, '^%d+$') or (#token > 1 and string.sub(token, 1, 1) == '0') then
  return redis.error_reply('ERR the fencing token must be a decimal number without leading zeros')
end
local seen = redis.call('GET', KEYS[2])
if seen ~= false then
  if not string.match(seen, '^%d+$') then
    return redis.error_reply('WRONGTYPE the stored fencing token is not a decimal number')
  end
  seen = (string.gsub(seen, '^0+(%d)', '%1'))
  if #token < #seen or (#token == #seen and token < seen) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], token)
return 1
