-- Read-write lock, writer acquire: the write grant, if no share and no other writer is live.
-- KEYS[1] = the lock key; ARGV[1] = our field ('w:<token>'), ARGV[2] = the lease in
-- milliseconds, ARGV[3] = our intent field ('i:<id>', or '' for none), ARGV[4] = the
-- intent's lifetime in milliseconds.
-- Returns 1 when granted, -1 when held by readers or another writer: then our intent is
-- recorded (or renewed), which blocks new readers.
-- The intent belongs to the wait, not to this attempt: a grant here leaves it in place
-- (renewed, where an earlier refusal recorded it), since the attempt may still fail on the
-- quorum and be cleaned up here, and the wait goes on. The wait withdraws it from every
-- node when it ends (hash_release.lua), granted or not, behind the wait's attempts on their
-- connections; an attempt that still reaches the node later (its connection broke with it
-- written) records the intent again for its short lifetime.
-- A key of another type raises WRONGTYPE: never touched.

local intent = ARGV[3]
if conflicting(ARGV[1]) then
  if intent ~= '' then
    hold(intent, ARGV[4])
    settle()
  end
  return -1
end
if intent ~= '' and live[intent] ~= nil then
  hold(intent, ARGV[4])
end
hold(ARGV[1], ARGV[2])
settle()
return 1
