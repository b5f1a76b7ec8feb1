-- What a node holds for a lock key, for operators: {type, holder, pttl}. The holder is a
-- plain lock's token, or a hash kind's hold fields joined by spaces. Read-only.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {kind, '', -2}
end
local pttl = redis.call('PTTL', KEYS[1])
if kind == 'string' then
  return {kind, redis.call('GET', KEYS[1]), pttl}
elseif kind == 'hash' then
  return {kind, table.concat(redis.call('HKEYS', KEYS[1]), ' '), pttl}
end
return {kind, '', pttl}
