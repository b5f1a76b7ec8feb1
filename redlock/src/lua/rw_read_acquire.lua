-- Read-write lock, reader acquire: one more share, unless a writer holds the lock or waits
-- for it (a live intent: writer preference).
-- KEYS[1] = the lock key; ARGV[1] = our field ('r:<token>'), ARGV[2] = the lease in ms.
-- Returns 1 when the share is set (or was already: a re-sent request), -1 when a writer
-- holds the lock, -2 when a writer waits. A key of another type raises WRONGTYPE.

-- Our own share already here (a re-sent request that landed twice): it is ours, whatever
-- came since, and refusing it would leave it behind, unreleased.
if live[ARGV[1]] then
  hold(ARGV[1], ARGV[2])
  settle()
  return 1
end
if conflicting(ARGV[1]) then
  return -1
end
if has('i:') then
  return -2
end
hold(ARGV[1], ARGV[2])
settle()
return 1
