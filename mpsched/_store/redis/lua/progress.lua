-- Record the latest progress of running jobs (field pg: JSON text), each only if `token`
-- is its lease's and it still runs: a late update of an ended job changes nothing.
--
-- ARGV: B, {id, token, progress} *
-- Returns how many were recorded.
local recorded = 0
for k = 2, #ARGV, 3 do
  local jk = B .. 'j:' .. ARGV[k]
  local f = redis.call('HMGET', jk, 't', 'st')
  if f[1] == ARGV[k + 1] and f[2] == 'running' then
    redis.call('HSET', jk, 'pg', ARGV[k + 2])
    recorded = recorded + 1
  end
end
return recorded
