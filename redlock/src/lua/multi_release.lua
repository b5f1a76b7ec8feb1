-- Multi release (after notify.lua): delete every key that still holds our token, leave
-- every other key alone, and tell each deleted key's waiters (naming the hold by its
-- token's first 16 characters, as release.lua does).
-- KEYS = the lock keys; ARGV[1] = our token, ARGV[1 + i] = the release channel of KEYS[i]
-- ('' to tell no one).
-- Returns {ours, foreign, refused}: how many keys held our token (and were deleted), how
-- many were held by another owner, and 1 when a notification was refused (an ACL user
-- without the channel: the release stands). Every key is read before any is deleted, so a
-- key of another type raises WRONGTYPE from GET before anything changed.
local locks = #KEYS
local values = {}
for i = 1, locks do
  values[i] = redis.call('GET', KEYS[i])
end
local ours, foreign, refused = 0, 0, 0
for i = 1, locks do
  if values[i] == ARGV[1] then
    redis.call('DEL', KEYS[i])
    if notify(ARGV[1 + i], string.sub(ARGV[1], 1, 16)) then
      refused = 1
    end
    ours = ours + 1
  elseif values[i] ~= false then
    foreign = foreign + 1
  end
end
return {ours, foreign, refused}
