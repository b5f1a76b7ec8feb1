-- Hash-based lock, release (after notify.lua): removes our own hold (and, for a writer,
-- its intent), never another's; when no hold remains, waiters are
-- told on the release channel (the message names the hold, or the intent withdrawn, by its
-- field's first 18 characters, as release.lua does: waiters count a release once a quorum
-- of nodes published the same one; the last reader's, or an owner's last re-entry's, names
-- none, only 'r:' or 'h:').
-- KEYS[1] = the lock key; ARGV[1] = our field (or '' to withdraw an intent alone), ARGV[2] =
-- the release channel ('' to tell no one), ARGV[3] = our intent field or ''.
-- Returns 1 when our field was removed, 2 when it was removed but the notification was
-- refused (an ACL user without the channel: the release stands), 0 when it was absent (expired, never set here), -1 when it was
-- absent and a conflicting hold exists. A key of another type (or a hash of another kind)
-- raises WRONGTYPE: never touched.

local changed = false
local result = 0
if ARGV[3] ~= '' and live[ARGV[3]] ~= nil then
  live[ARGV[3]] = nil
  redis.call('HDEL', key, ARGV[3])
  changed = true
end
if ARGV[1] ~= '' and live[ARGV[1]] ~= nil then
  live[ARGV[1]] = nil
  redis.call('HDEL', key, ARGV[1])
  changed = true
  result = 1
elseif ARGV[1] ~= '' and conflicting(ARGV[1]) then
  result = -1
end
if changed then
  settle()
  local holding = false
  for field in pairs(live) do
    if string.sub(field, 1, 2) ~= 'i:' then holding = true end
  end
  if not holding then
    local hold = ARGV[1]
    if hold == '' then hold = ARGV[3] end
    local name = string.sub(hold, 1, 18)
    -- Readers' shares, and one owner's re-entries, leave in any order: which one left
    -- last differs from node to node, so no one hold's release would reach a quorum. The
    -- message names no hold then, only its kind, like a forced release's '1': waiters
    -- count it once per node.
    local kind = string.sub(hold, 1, 2)
    if kind == 'r:' or kind == 'h:' then name = kind end
    if notify(ARGV[2], name) and result == 1 then
      result = 2
    end
  end
end
return result
