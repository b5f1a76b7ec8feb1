-- Put first in the scripts that renew a key. Renews `key` to `ms` from now, never shortening
-- it: the client may count a failed extension as not having happened and keep its old
-- validity, so a shorter lease landing anyway must not let another client in before that
-- validity ends. (PEXPIRE ... GT does this from Redis 7.0 on; this works on 6.2.)
local function lengthen(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
