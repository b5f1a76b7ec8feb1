-- Raise a fencing counter to at least ARGV[1], so that every later grant, whose quorum
-- overlaps this one, reads a counter at least this high.
-- KEYS[1] = the counter, ARGV[1] = the token, in decimal without leading zeros.
-- Counters are compared as digit strings, never as Lua numbers (doubles lose integers
-- above 2^53). Returns 1; a counter that is not a decimal number raises WRONGTYPE.
local current = redis.call('GET', KEYS[1])
local token = ARGV[1]
if current ~= false and not string.match(current, '^%d+$') then
  return redis.error_reply('WRONGTYPE the fencing counter is not a decimal number')
end
if current ~= false then
  current = (string.gsub(current, '^0+(%d)', '%1'))
end
if current == false or #current < #token or (#current == #token and current < token) then
  redis.call('SET', KEYS[1], token)
end
return 1
