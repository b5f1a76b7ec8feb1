-- Multi check: whether every key still holds our token here.
-- KEYS = the lock keys, ARGV[1] = our token.
-- Returns 1 when all do, -1 when another owner holds any of them, else 0.
local result = 1
for _, key in ipairs(KEYS) do
  local current = redis.call('GET', key)
  if current ~= false and current ~= ARGV[1] then
    return -1
  elseif current == false then
    result = 0
  end
end
return result
