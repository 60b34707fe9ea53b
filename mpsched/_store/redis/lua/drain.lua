-- Take up to n job ids from `me`'s inbox, with how each ended.
--
-- ARGV: B, me, n
-- Returns, per job: {id, state, outcome, crashed_worker, client, owner}; state is false
-- for a job already forgotten.
local ids = redis.call('LPOP', B .. 'in:' .. ARGV[2], tonumber(ARGV[3]))
local ended = {}
if not ids then return ended end
for k, id in ipairs(ids) do
  local f = redis.call('HMGET', B .. 'j:' .. id, 'st', 'out', 'x', 'c', 'o')
  ended[k] = {id, f[1], f[2], f[3], f[4], f[5]}
end
return ended
