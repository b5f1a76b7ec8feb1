-- Reentrant lock, the kind's header: every hold is a field 'h:<token>:<owner>' (the token is
-- 40 hex characters, unique per hold), so that a hold's release, extension or re-sent
-- request touches that hold and no other, even of the same owner.
local KIND = 'reentrant lock'
local FIELD_KINDS = {['h:'] = true}
local function owner_of(field)
  return string.sub(field, 44)
end
-- Holds of one owner share the lock; another owner's hold excludes it.
local function conflicts(mine, other)
  return owner_of(mine) ~= owner_of(other)
end
