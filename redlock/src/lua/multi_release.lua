-- Multi release: delete every key that still holds our token, leave every other key alone,
-- and tell each deleted key's waiters.
-- KEYS = the lock keys, ARGV[1] = our token, ARGV[1 + i] = the release channel of KEYS[i].
-- Returns {ours, foreign, refused}: how many keys held our token (and were deleted), how
-- many were held by another owner, and 1 when a notification was refused (an ACL user
-- without the channel: the release stands). Every key is read before any is deleted, so a
-- key of another type raises WRONGTYPE from GET before anything changed.
local values = {}
for i, key in ipairs(KEYS) do
  values[i] = redis.call('GET', key)
end
local ours, foreign, refused = 0, 0, 0
for i, key in ipairs(KEYS) do
  if values[i] == ARGV[1] then
    redis.call('DEL', key)
    local published = redis.pcall('PUBLISH', ARGV[1 + i], '1')
    if type(published) == 'table' and published.err then
      refused = 1
    end
    ours = ours + 1
  elseif values[i] ~= false then
    foreign = foreign + 1
  end
end
return {ours, foreign, refused}
