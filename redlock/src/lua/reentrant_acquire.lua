-- Reentrant lock, acquire (after create_guard.lua): one more hold, unless another owner holds the lock.
-- KEYS[1] = the lock key, then the abandoned tokens'
-- tombstones, then ours; ARGV[1] = our field ('h:<token>:<owner>'),
-- ARGV[2] = the lease in milliseconds, then the client's abandoned tokens, then the deadline.
-- Returns 1 when the hold is set (or was already: a re-sent request), -1 when another owner
-- holds the lock. A key of another type raises WRONGTYPE: never touched.

forget(abandoned_from(3), ARGV[2])
if conflicting(ARGV[1]) then
  return -1
end
hold(ARGV[1], ARGV[2])
settle()
return 1
