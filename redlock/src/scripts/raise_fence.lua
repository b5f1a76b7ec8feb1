-- Raise the fencing counter to at least ARGV[1], so that every later grant whose quorum
-- overlaps this one sees a larger counter. KEYS[1] = the fencing counter.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
