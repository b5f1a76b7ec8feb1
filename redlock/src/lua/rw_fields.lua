-- Read-write lock, the kind's header: 'r:<token>' is one reader's share, 'w:<token>' the
-- writer's grant, 'i:<id>' a waiting writer's intent (see rw_write_acquire.lua).
local KIND = 'read-write lock'
local FIELD_KINDS = {['r:'] = true, ['w:'] = true, ['i:'] = true}
-- A writer conflicts with everyone, readers with writers only; intents are the acquire
-- scripts' business.
local function conflicts(mine, other)
  local a, b = string.sub(mine, 1, 2), string.sub(other, 1, 2)
  if a == 'i:' or b == 'i:' then return false end
  return a == 'w:' or b == 'w:'
end
