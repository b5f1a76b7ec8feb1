-- Reentrant lock, acquire: one more hold, unless another owner holds the lock.
-- KEYS[1] = the lock key; ARGV[1] = our field ('h:<token>:<owner>'), ARGV[2] = the lease in
-- milliseconds.
-- Returns 1 when the hold is set (or was already: a re-sent request), -1 when another owner
-- holds the lock. A key of another type raises WRONGTYPE: never touched.

if conflicting(ARGV[1]) then
  return -1
end
hold(ARGV[1], ARGV[2])
settle()
return 1
