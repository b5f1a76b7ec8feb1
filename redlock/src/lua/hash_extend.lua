-- Hash-based lock, extend: renews our own hold if it is still live here; never shortens it
-- (a failed extension must leave the old validity backed), never sets it again where it is
-- gone (that node no longer counts), never touches another's.
-- KEYS[1] = the lock key; ARGV[1] = our field, ARGV[2] = the new lease in milliseconds.
-- Returns 1 when renewed, 0 when our field is absent, -1 when it is absent and a
-- conflicting hold exists. A key of another type raises WRONGTYPE: never touched.

if live[ARGV[1]] == nil then
  if conflicting(ARGV[1]) then
    return -1
  end
  return 0
end
hold(ARGV[1], ARGV[2])
settle()
return 1
