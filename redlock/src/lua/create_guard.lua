-- Put first in every script that creates or renews a hold (acquisitions of every kind,
-- extensions). What makes the protocol independent of the order in which a node sees one
-- token's requests:
-- - ARGV[#ARGV] is the request's deadline in the node's own milliseconds (the client's
--   estimate of the node's clock when it sent the request, plus the node timeout and the
--   estimate's error; 0 when the client has no estimate). Past it the client has given up
--   on the request, so a request run later (a node that was hung, a connection's buffered
--   bytes read after a reset) changes nothing: a late create can never outlive its undo.
-- - KEYS[#KEYS] is the token's tombstone (undo_mark.lua): once an undo of the token ran
--   here, nothing of the token is created here again while it lives, and it lives until
--   the token's last create is past its deadline.
-- Both refusals are error replies: LATE (the client counts it as timed out) and UNDONE.
do
  local deadline = tonumber(ARGV[#ARGV]) or 0
  if deadline > 0 then
    local clock = redis.call('TIME')
    local at = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    if at > deadline then
      return redis.error_reply('LATE the request reached the node after its deadline')
    end
  end
  if redis.call('GET', KEYS[#KEYS]) then
    return redis.error_reply('UNDONE the hold was already released or cleaned up here')
  end
end
-- The client's own abandoned tokens on these keys, ARGV[from] to ARGV[#ARGV - 1], each
-- with its tombstone, the KEYS just before our own (same order): token -> tombstone. They
-- are holds the client gave up, whose undos may not have reached this node yet. A key or
-- field one of them holds counts as free for the client's next acquisition, which so never
-- waits for its own undos: the client let go of them, so taking their place is what their
-- undo arriving first would have allowed.
local function abandoned_from(from)
  local count = #ARGV - from
  local first = #KEYS - count
  local tombstones = {}
  for i = 0, count - 1 do
    tombstones[ARGV[from + i]] = KEYS[first + i]
  end
  return tombstones, count
end
-- Marks an abandoned token's hold as taken over (its tombstone says removed, for at least
-- `ms`): its undo, whenever it comes, answers as if it had removed the hold itself, and a
-- late create of that token is refused.
local function taken_over(tombstone, ms)
  if redis.call('PTTL', tombstone) < tonumber(ms) then
    redis.call('SET', tombstone, '1', 'PX', ms)
  else
    redis.call('SET', tombstone, '1', 'KEEPTTL')
  end
end
-- Renews `key` to `ms` from now, never shortening it: the client may count a failed
-- extension as not having happened and keep its old validity, so a shorter lease landing
-- anyway must not let another client in before that validity ends. (PEXPIRE ... GT does
-- this from Redis 7.0 on; this works on 6.2.)
local function lengthen(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
