-- Release (after notify.lua): delete the key only if it still holds our token, and tell the
-- waiters (the message names the hold by its token's first 16 characters, which tell holds
-- apart without giving a token away to whoever may subscribe: waiters count a release once
-- a quorum of nodes published the same one, so the clean-up of a failed attempt, short of a
-- quorum, wakes no one).
-- KEYS[1] = the lock key; ARGV[1] = our token, ARGV[2] = the release channel ('' to tell no
-- one).
-- Returns 1 when deleted, 2 when deleted but the notification was refused (an ACL user
-- without the channel: the release stands, waiters fall back to polling), 0 when the key is
-- absent, -1 when another owner holds it. A key of another type raises WRONGTYPE from GET:
-- never touched.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if notify(ARGV[2], string.sub(ARGV[1], 1, 16)) then
    return 2
  end
  return 1
elseif current == false then
  return 0
end
return -1
