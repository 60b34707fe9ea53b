-- Cancel pending jobs: by id, or every pending job of one client (due later than now
-- only, with not_due = '1'). With a nonce, a client's jobs that managers hold
-- prefetched are found among every live manager's leases (l:<manager>: the jobs in
-- flight, so only a cancel of all of a client's jobs pays for it, never a claim) and
-- treated as if named by id, below.
--
-- A job named by id that a manager claimed as *prefetched* (pf: its worker may not have
-- started it) can be cancelled only by that manager, which can take it back from its
-- worker: with a nonce, such a job is marked (cx = "nonce|me") and its manager asked,
-- on its channel ("C" nonce " " ids), to give back the ones its worker has not started;
-- a job given back while marked is cancelled (requeue() in common.lua), and the manager
-- answers on the list cr:<nonce>. Then the caller settles (mode 'settle', the same
-- nonce and ids): a marked job that was cancelled is reported cancelled, any other one
-- is unmarked (it started: the cancel failed).
--
-- ARGV: B, me, ttl_ms, keep_ms, client, not_due, mode, nonce, {id} *
-- Returns, per job cancelled: {id, client, mine} (mine = 1: `me` tells its clients);
-- per job asked of its manager: {id, client, 2, manager} (mode '' only).
local me = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local keep_ms = tonumber(ARGV[4])
local client = ARGV[5]
local mode = ARGV[7]
local nonce = ARGV[8]
local now = now_us()

local ids = {}
if client ~= '' then
  local from = '-inf'
  if ARGV[6] == '1' then from = '(' .. now end
  ids = redis.call('ZRANGEBYSCORE', B .. 'c:' .. client, from, '+inf')
  if nonce ~= '' and ARGV[6] ~= '1' then
    for _, m in ipairs(redis.call('ZRANGE', B .. 'managers', 0, -1)) do
      for _, id in ipairs(redis.call('SMEMBERS', B .. 'l:' .. m)) do
        local f = redis.call('HMGET', B .. 'j:' .. id, 'c', 'pf')
        if f[1] == client and f[2] == '1' then ids[#ids + 1] = id end
      end
    end
  end
else
  for k = 9, #ARGV do ids[#ids + 1] = ARGV[k] end
end

local mark = nonce .. '|' .. me
local cancelled = {}
if mode == 'settle' then
  for _, id in ipairs(ids) do
    local jk = B .. 'j:' .. id
    local f = redis.call('HMGET', jk, 'st', 'cx', 'c')
    if f[2] == mark then
      redis.call('HDEL', jk, 'cx')
      if f[1] == 'cancelled' then cancelled[#cancelled + 1] = {id, f[3], 1} end
    end
  end
  return cancelled
end

local asked = {}
for _, id in ipairs(ids) do
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 'st', 'pr', 's', 'c', 'o', 'k', 'wd', 'pf', 'm', 'cx')
  if f[1] == 'pending' then
    unqueue(id, f[2], f[3])
    redis.call('ZREM', B .. 'c:' .. f[4], id)
    redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[2], -1)
    count_bytes(-payload_bytes(id))
    local mine = cancelled_end(id, f[4], f[5], f[6], f[7], me, ttl_ms, keep_ms, now)
    cancelled[#cancelled + 1] = {id, f[4], mine}
  elseif f[1] == 'running' and f[8] == '1' and nonce ~= '' and not f[10]
      and redis.call('ZSCORE', B .. 'managers', f[9]) then
    redis.call('HSET', jk, 'cx', mark)
    if not asked[f[9]] then asked[f[9]] = {} end
    table.insert(asked[f[9]], id)
    cancelled[#cancelled + 1] = {id, f[4], 2, f[9]}
  end
end
for holder, held in pairs(asked) do
  if holder ~= me then
    redis.call('PUBLISH', B .. 'ch:' .. holder, 'C' .. nonce .. ' ' .. table.concat(held, ' '))
  end
end
write_bytes()
return cancelled
