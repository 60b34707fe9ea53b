-- Take up to n job ids from `me`'s inbox, with how each ended; first drop the `done`
-- ids at its head that the last call returned and `me` has delivered. An id stays in
-- the inbox until a later call says it was delivered: an answer that was lost (Redis
-- paused past the caller's timeout) hands the same ends over again, never none.
--
-- ARGV: B, me, n, done
-- Returns, per job: {id, state, outcome, crashed_worker, client, owner}; state is false
-- for a job already forgotten.
local inbox = B .. 'in:' .. ARGV[2]
local done = tonumber(ARGV[4])
if done > 0 then redis.call('LTRIM', inbox, done, -1) end
local ids = redis.call('LRANGE', inbox, 0, tonumber(ARGV[3]) - 1)
local ended = {}
for k, id in ipairs(ids) do
  local f = redis.call('HMGET', B .. 'j:' .. id, 'st', 'out', 'x', 'c', 'o')
  ended[k] = {id, f[1], f[2], f[3], f[4], f[5]}
end
return ended
