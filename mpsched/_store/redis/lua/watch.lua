-- Watch a job's end from `me`: if it has ended, its end now; else `me` is told when it
-- ends (its inbox), as its owner is.
--
-- ARGV: B, me, id
-- Returns false for an unknown job, else {state, outcome, crashed_worker, client}.
local me, id = ARGV[2], ARGV[3]
local f = redis.call('HMGET', B .. 'j:' .. id, 'st', 'out', 'x', 'c', 'o')
if not f[1] then return false end
if f[1] == 'pending' or f[1] == 'running' then
  if f[5] ~= me then
    redis.call('SADD', B .. 'w:' .. id, me)
    redis.call('HSET', B .. 'j:' .. id, 'wd', 1)
  end
end
return {f[1], f[2], f[3], f[4]}
