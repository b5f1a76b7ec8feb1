-- Put first in every script that undoes a hold (releases, clean-ups). Tells the key's
-- waiters, on `channel`, that the hold named `message` left; a channel of '' (a clean-up of
-- an attempt that never held a quorum) tells no one. True when the node refused to publish
-- (an ACL user without the channel: the undo stands, waiters poll).
local function notify(channel, message)
  if channel == '' then return false end
  local published = redis.pcall('PUBLISH', channel, message)
  return type(published) == 'table' and published.err ~= nil
end
