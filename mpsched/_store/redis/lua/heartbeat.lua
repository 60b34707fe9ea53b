-- A manager says it is alive (its leases last lease_ms more) and what it runs; then
-- takes back the jobs of managers whose leases ran out: retried if their retries allow
-- (counted as an attempt), else failed as crashed. Idempotent: whoever reaps first does.
--
-- The queue's order ("time" or "priority", the key `order`; "time" when none is
-- recorded) is the store's: a manager with another one is refused while any other
-- manager is live (an error reply "ORDER <the store's order>", nothing changed) if it
-- joins (join = '1'); one that beats again after it was presumed dead follows the
-- store's. With no other manager live, the caller's order becomes the store's (the jobs
-- waiting in `rdy` go back to `due` for "time").
--
-- ARGV: B, me, lease_ms, ttl_ms, keep_ms, status, order, join
-- Returns {registered_before, reaped, failed, requeued, next_ms, order, taken}: reaped lists
-- the managers presumed dead, and taken for each {manager, its lease_ms (-1: unknown),
-- jobs requeued, jobs failed}; failed lists {id, worker, client, mine} of the jobs failed;
-- next_ms is how long until the lease of the first other manager runs out (-1: none),
-- when the caller beats again to take its jobs back at once if it is dead; order is the
-- store's, which the caller's claims must follow.
local me = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local ttl_ms = tonumber(ARGV[4])
local keep_ms = tonumber(ARGV[5])
local order = ARGV[7]
local now = now_us()
local recorded = redis.call('GET', B .. 'order') or 'time'
if recorded ~= order then
  local others = false
  local live = redis.call('ZRANGEBYSCORE', B .. 'managers', string.format('(%d', now),
                          '+inf', 'LIMIT', 0, 2)
  for _, m in ipairs(live) do
    if m ~= me then others = true end
  end
  if not others then
    redis.call('SET', B .. 'order', order)
    if order == 'time' then demote_all() end
  elseif ARGV[8] == '1' then
    return redis.error_reply('ORDER ' .. recorded)
  else
    order = recorded
  end
end
-- A store whose jobs were submitted before pending payload bytes were counted: the first
-- manager to join counts them once (every pending job's HSTRLEN), so that the counter
-- starts right rather than low by their sum forever.
if ARGV[8] == '1' and redis.call('HEXISTS', B .. 'stats', 'pending_bytes') == 0 then
  local total = 0
  for _, m in ipairs(redis.call('ZRANGE', B .. 'due', 0, -1)) do
    total = total + payload_bytes(string.sub(m, 19))
  end
  for _, m in ipairs(redis.call('ZRANGE', B .. 'rdy', 0, -1)) do
    total = total + payload_bytes(string.sub(m, 34))
  end
  redis.call('HSET', B .. 'stats', 'pending_bytes', total)
end
-- Time in which no manager beat (the server was down or paused, or every manager was)
-- is not counted against anyone's lease: whoever beats first after such a silence moves
-- every lease on by its length, so a store that comes back takes nobody for dead. A
-- manager that died before the silence is taken back that much later, at most one lease.
local last = tonumber(redis.call('GET', B .. 'hb'))
if last and now - last > lease_ms * 500 then
  local leases = redis.call('ZRANGE', B .. 'managers', 0, -1, 'WITHSCORES')
  for k = 1, #leases, 2 do
    redis.call('ZADD', B .. 'managers',
               string.format('%d', tonumber(leases[k + 1]) + now - last), leases[k])
  end
end
redis.call('SET', B .. 'hb', string.format('%d', now))
local before = 0
if redis.call('ZSCORE', B .. 'managers', me) then before = 1 end
redis.call('ZADD', B .. 'managers', now + lease_ms * 1000, me)
redis.call('HSET', B .. 'm:' .. me, 'seen', now, 'lease_ms', lease_ms, 'status', ARGV[6])

local reaped, failed, requeued, taken = {}, {}, 0, {}
local new_head = false
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', B .. 'managers', '-inf', now,
                                 'LIMIT', 0, 16)) do
  reaped[#reaped + 1] = dead
  local counted = {requeued, #failed}
  for _, id in ipairs(redis.call('SMEMBERS', B .. 'l:' .. dead)) do
    local jk = B .. 'j:' .. id
    local f = redis.call('HMGET', jk, 'st', 'm', 'a', 'r', 'w', 'c', 'o', 'k', 'wd', 'lim',
                         'ls')
    if f[1] == 'running' and f[2] == dead then
      if tonumber(f[3]) <= tonumber(f[4]) then
        if requeue(id, nil, '1', ttl_ms, keep_ms, now) == 2 then new_head = true end
        requeued = requeued + 1
      else
        redis.call('HSET', jk, 'st', 'failed', 'f', now, 'x', f[5])
        redis.call('HDEL', jk, 'out')  -- its payload stays: it may be requeued by id
        if f[10] then free_slot(jk, f[10], f[11], now) end
        redis.call('HINCRBY', B .. 'stats', 'failed', 1)
        local mine, others = notify(id, f[7], me, f[9],
                                    ended_message(id, 'failed', f[6], f[5], nil))
        retire(id, f[8], ttl_ms, others, keep_ms, now)
        if redis.call('HGET', jk, 'hk') then
          release_kids(id, false, 'WorkerCrashedError', ttl_ms, keep_ms, now, nil)
        end
        failed[#failed + 1] = {id, f[5], f[6], mine}
      end
    end
  end
  taken[#taken + 1] = {dead, tonumber(redis.call('HGET', B .. 'm:' .. dead, 'lease_ms')) or -1,
                       requeued - counted[1], #failed - counted[2]}
  -- Its inbox stays a while: a manager only paused finds there what it is owed.
  redis.call('DEL', B .. 'l:' .. dead, B .. 'm:' .. dead)
  redis.call('PEXPIRE', B .. 'in:' .. dead, INBOX_KEEP_MS)
  redis.call('ZREM', B .. 'managers', dead)
  redis.call('ZREM', B .. 'idle', dead)
  if redis.call('GET', B .. 'leader') == dead then
    redis.call('DEL', B .. 'leader')
    new_head = true
  end
end
if new_head then wake() end
write_bytes()
local first = redis.call('ZRANGE', B .. 'managers', 0, 1, 'WITHSCORES')
local next_ms = -1
for k = 1, #first, 2 do
  if first[k] ~= me then
    next_ms = math.floor((tonumber(first[k + 1]) - now) / 1000)
    if next_ms < 0 then next_ms = 0 end
    break
  end
end
return {before, reaped, failed, requeued, next_ms, order, taken}
