-- Put first in every script that undoes a hold (releases, clean-ups). KEYS[#KEYS] is the
-- token's tombstone, ARGV[#ARGV] how long it must live (in milliseconds): until the
-- token's last create is past its deadline (create_guard.lua), and the undo's sender has
-- read its replies.
-- Its value says whether the token's hold was removed here ('1'), by this send or an earlier
-- send of the same undo, or was absent when the undo came ('0'): a re-sent release answers
-- exactly.
local tombstone = KEYS[#KEYS]
local keep = tonumber(ARGV[#ARGV]) or 0
-- Whether an earlier undo of the token removed its hold here.
local function removed_before()
  return redis.call('GET', tombstone) == '1'
end
-- Leaves the tombstone: `removed` when this send removed the hold. Its lifetime never
-- shrinks; a removal always leaves one (a re-send must be able to tell), at least 1 ms.
local function undone(removed)
  if not removed and keep <= 0 then
    return
  end
  -- The argument as it came when it is the lifetime: a number passed to redis.call is
  -- formatted back into text first.
  local ms = ARGV[#ARGV]
  if keep < 1 then ms = '1' end
  -- The common case, a first removal, is one call.
  if removed and redis.call('SET', tombstone, '1', 'PX', ms, 'NX') then
    return
  end
  if redis.call('PTTL', tombstone) < math.max(keep, 1) then
    local mark = '0'
    if removed or removed_before() then mark = '1' end
    -- On a node over its maxmemory Redis refuses a script's first write that may grow
    -- memory (OOM), not the ones after a write it ran: this DEL (which frees, and changes
    -- nothing the SET does not) comes first, so that an undo that removed nothing still
    -- leaves the tombstone that refuses its token's create arriving later. (A removal
    -- wrote before: its SET is never refused.)
    redis.call('DEL', tombstone)
    redis.call('SET', tombstone, mark, 'PX', ms)
  elseif removed then
    redis.call('SET', tombstone, '1', 'KEEPTTL')
  end
end
-- Tells the key's waiters, on `channel`, that the hold named `message` left; a channel of ''
-- (a clean-up of an attempt that never held a quorum) tells no one. True when the node
-- refused to publish (an ACL user without the channel: the undo stands, waiters poll).
local function notify(channel, message)
  if channel == '' then return false end
  local published = redis.pcall('PUBLISH', channel, message)
  return type(published) == 'table' and published.err ~= nil
end
