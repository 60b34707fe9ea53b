-- Cancel pending jobs: by id, or every pending job of one client (due later than now
-- only, with not_due = '1').
--
-- ARGV: B, me, ttl_ms, keep_ms, client, not_due, {id} *
-- Returns, per job cancelled: {id, client, mine} (mine = 1: `me` tells its clients).
local me = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local keep_ms = tonumber(ARGV[4])
local client = ARGV[5]
local now = now_us()

local ids = {}
if client ~= '' then
  local from = '-inf'
  if ARGV[6] == '1' then from = '(' .. now end
  ids = redis.call('ZRANGEBYSCORE', B .. 'c:' .. client, from, '+inf')
else
  for k = 7, #ARGV do ids[#ids + 1] = ARGV[k] end
end

local cancelled = {}
for _, id in ipairs(ids) do
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 'st', 'pr', 's', 'c', 'o', 'k', 'wd')
  if f[1] == 'pending' then
    redis.call('ZREM', B .. 'due', member(f[2], f[3], id))
    redis.call('ZREM', B .. 'c:' .. f[4], id)
    redis.call('HSET', jk, 'st', 'cancelled', 'f', now)
    redis.call('HDEL', jk, 'p')
    redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[2], -1)
    redis.call('HINCRBY', B .. 'stats', 'cancelled', 1)
    if f[6] and redis.call('GET', B .. 'k:' .. f[6]) == id then
      redis.call('DEL', B .. 'k:' .. f[6])
    end
    local mine, others = notify(id, f[5], me, f[7],
                                ended_message(id, 'cancelled', f[4], nil, nil))
    retire(id, false, ttl_ms, others, keep_ms, now)
    cancelled[#cancelled + 1] = {id, f[4], mine}
  end
end
return cancelled
