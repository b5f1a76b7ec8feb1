-- Multi release: delete every key that still holds our token, leave every other key alone,
-- and tell each deleted key's waiters.
-- KEYS = the lock keys, ARGV[1] = our token, ARGV[1 + i] = the release channel of KEYS[i].
-- Returns {ours, foreign}: how many keys held our token (and were deleted), and how many
-- were held by another owner. Every key is read before any is deleted, so a key of another
-- type raises WRONGTYPE from GET before anything changed.
local values = {}
for i, key in ipairs(KEYS) do
  values[i] = redis.call('GET', key)
end
local ours, foreign = 0, 0
for i, key in ipairs(KEYS) do
  if values[i] == ARGV[1] then
    redis.call('DEL', key)
    redis.call('PUBLISH', ARGV[1 + i], '1')
    ours = ours + 1
  elseif values[i] ~= false then
    foreign = foreign + 1
  end
end
return {ours, foreign}
