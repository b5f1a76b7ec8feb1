-- An administrator's release of the holds a forced release saw when it started: deletes the
-- lock key if it still holds one of those tokens, or the hash fields among those holds, and
-- never a hold set since (a holder granted while the call runs keeps its lock). Running it
-- twice has the effect of running it once.
-- KEYS[1] = the key; ARGV[1] = its release channel; ARGV[2..] = the holds seen (a plain or
-- multi lock's token, a hash kind's field names). Returns how many holds it removed; waiters
-- are told when it removed any.
local kind = redis.call('TYPE', KEYS[1])['ok']
local removed = 0
if kind == 'string' then
  local token = redis.call('GET', KEYS[1])
  for i = 2, #ARGV do
    if token == ARGV[i] then
      removed = redis.call('DEL', KEYS[1])
      break
    end
  end
elseif kind == 'hash' then
  for i = 2, #ARGV do
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
if removed > 0 then
  redis.pcall('PUBLISH', ARGV[1], '1')
end
return removed
