-- What a node holds for a lock key, for operators: {type, holder, pttl, hold...}. The holder
-- is a plain lock's token, or a hash kind's hold fields joined by spaces; the holds after
-- the first three items are the same, one per item (a reentrant owner id may contain a
-- space). Read-only.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {kind, '', -2}
end
local pttl = redis.call('PTTL', KEYS[1])
if kind == 'string' then
  local token = redis.call('GET', KEYS[1])
  return {kind, token, pttl, token}
elseif kind == 'hash' then
  local fields = redis.call('HKEYS', KEYS[1])
  local view = {kind, table.concat(fields, ' '), pttl}
  for _, field in ipairs(fields) do
    table.insert(view, field)
  end
  return view
end
return {kind, '', pttl}
