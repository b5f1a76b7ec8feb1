-- Hash-based lock, check: whether our hold is live here.
-- KEYS[1] = the lock key, ARGV[1] = our field.
-- Returns 1 when live, 0 when absent, -1 when absent and a conflicting hold exists.

if live[ARGV[1]] ~= nil then
  return 1
elseif conflicting(ARGV[1]) then
  return -1
end
return 0
