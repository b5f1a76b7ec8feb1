-- Read-write lock, writer acquire (after create_guard.lua): the write grant, if no share and no other writer is live.
-- KEYS[1] = the lock key, KEYS[2] = our intent's tombstone (when we have an intent), then
-- the abandoned tokens' tombstones, then ours; ARGV[1] = our field ('w:<token>'),
-- ARGV[2] = the lease in milliseconds, ARGV[3] = our intent field ('i:<id>', or '' for
-- none), ARGV[4] = the intent's lifetime in milliseconds, ARGV[5] = how long the intent's
-- tombstone lives, then the client's abandoned tokens, then the deadline.
-- Returns 1 when granted (our intent, fulfilled, is removed, and its tombstone left so that
-- a refused attempt of the same wait that reaches the node later records it no more), -1
-- when held by readers or another writer: then our intent is recorded (or renewed), which
-- blocks new readers.
-- A key of another type raises WRONGTYPE: never touched.

local intent = ARGV[3]
-- Our wait already withdrew its intent here (the withdrawal overtook this attempt): record
-- none again.
if intent ~= '' and redis.call('GET', KEYS[2]) then
  intent = ''
end
forget(abandoned_from(6), ARGV[2])
if conflicting(ARGV[1]) then
  if intent ~= '' then
    hold(intent, ARGV[4])
    settle()
  end
  return -1
end
if ARGV[3] ~= '' then
  if live[ARGV[3]] ~= nil then
    live[ARGV[3]] = nil
    redis.call('HDEL', key, ARGV[3])
  end
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
end
hold(ARGV[1], ARGV[2])
settle()
return 1
