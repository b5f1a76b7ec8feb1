-- Multi release (after undo_mark.lua): delete every key that still holds our token, leave
-- every other key alone, leave our tombstone, and tell each deleted key's waiters (naming
-- the hold by its token's first 16 characters, as release.lua does).
-- KEYS = the lock keys, then our tombstone; ARGV[1] = our token, ARGV[1 + i] = the release
-- channel of KEYS[i] ('' to tell no one), ARGV[#ARGV] = the tombstone's lifetime in milliseconds.
-- Returns {ours, foreign, refused, before}: how many keys held our token (and were
-- deleted), how many were held by another owner, 1 when a notification was refused (an ACL
-- user without the channel: the release stands), and 1 when an earlier send of this undo
-- deleted ours, or the client's next acquisition took their place. Every key is read before any is deleted, so a key of another type raises
-- WRONGTYPE from GET before anything changed.
local locks = #KEYS - 1
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
-- An earlier send of this undo removed ours, or the client's next acquisition took their
-- place (create_guard.lua's `taken_over`).
local before = 0
if removed_before() then
  before = 1
end
undone(ours > 0)
return {ours, foreign, refused, before}
