-- Reentrant lock, the kind's header: every hold is a field 'h:<token>:<owner>' (the token is
-- 40 hex characters, unique per hold, then '.<owner label>' if the client has one; it never
-- contains ':'), so that a hold's release, extension or re-sent request touches that hold
-- and no other, even of the same owner.
local KIND = 'reentrant lock'
local FIELD_KINDS = {['h:'] = true}
local function owner_of(field)
  -- After the first ':' that follows the token: the owner id itself may contain ':'.
  return string.match(field, '^h:[^:]*:(.*)$') or field
end
-- Holds of one owner share the lock; another owner's hold excludes it.
local function conflicts(mine, other)
  return owner_of(mine) ~= owner_of(other)
end
