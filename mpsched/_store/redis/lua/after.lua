-- Submit jobs that wait for others, all or none, due on the server's clock once their
-- last parent has ended (see release_kids in common.lua).
--
-- ARGV: B, owner, ttl_ms, keep_ms, n,
--       {id, client, name, payload, level, delay_us, at_us, timeout, retries, allow, rs,
--        np, {parent} * np, nr, {parent} * nr} * n
-- (delay_us or at_us is "", as in submit.lua; allow = '1': run even after a parent that
-- failed or was cancelled; rs its retry state, "" for a job without a retry policy; the
-- nr parents are those whose outcomes its ResultOf take).
--
-- A parent pending or running (or a job of this batch before it) is waited for; one
-- that ended counts as ended; one unknown fails the whole batch: NOTFOUND <id>. A job
-- whose parent failed or was cancelled (and that does not allow it) fails at once.
--
-- Returns 1.
local owner = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local keep_ms = tonumber(ARGV[4])
local n = tonumber(ARGV[5])

local jobs = {}
local at = 6
for k = 1, n do
  local job = {at = at}
  local np = tonumber(ARGV[at + 11])
  job.parents = {}
  for p = 1, np do job.parents[p] = ARGV[at + 11 + p] end
  local nr_at = at + 12 + np
  local results = {}
  for r = 1, tonumber(ARGV[nr_at]) do results[r] = ARGV[nr_at + r] end
  job.results = table.concat(results, ' ')
  jobs[k] = job
  at = nr_at + 1 + #results
end

-- All or none: every id new, every parent known.
local batch = {}
for _, job in ipairs(jobs) do
  local id = ARGV[job.at]
  if batch[id] or redis.call('EXISTS', B .. 'j:' .. id) == 1 then
    return redis.error_reply('DUPLICATE job id ' .. id .. ' is already in the store')
  end
  for _, parent in ipairs(job.parents) do
    if not batch[parent] and redis.call('EXISTS', B .. 'j:' .. parent) == 0 then
      return redis.error_reply('NOTFOUND ' .. parent)
    end
  end
  batch[id] = true
end

local now = now_us()
local seq = redis.call('INCRBY', B .. 'seq', n) - n
local outbox = new_outbox()
for _, job in ipairs(jobs) do
  local a = job.at
  seq = seq + 1
  local id, client, level = ARGV[a], ARGV[a + 1], ARGV[a + 4]
  local due = now
  if ARGV[a + 6] ~= '' then due = tonumber(ARGV[a + 6])
  elseif ARGV[a + 5] ~= '' then due = now + tonumber(ARGV[a + 5]) end
  local fields = {'c', client, 'o', owner, 'n', ARGV[a + 2], 'p', ARGV[a + 3],
                  'pr', level, 'd', due, 's', seq, 'to', ARGV[a + 7], 'r', ARGV[a + 8],
                  'a', 0, 'sub', now, 'st', 'pending'}
  if ARGV[a + 9] == '1' then
    fields[#fields + 1] = 'wa'
    fields[#fields + 1] = 1
  end
  if ARGV[a + 10] ~= '' then
    fields[#fields + 1] = 'rs'
    fields[#fields + 1] = ARGV[a + 10]
  end
  if job.results ~= '' then
    fields[#fields + 1] = 'wr'
    fields[#fields + 1] = job.results
  end
  redis.call('HSET', B .. 'j:' .. id, unpack(fields))
  redis.call('ZADD', B .. 'all', seq, id)
  redis.call('HINCRBY', B .. 'stats', 'pending:' .. level, 1)
  redis.call('HINCRBY', B .. 'stats', 'submitted', 1)
  count_bytes(#ARGV[a + 3])
  local live, failed_by, how = 0, nil, nil
  for _, parent in ipairs(job.parents) do
    local st = redis.call('HGET', B .. 'j:' .. parent, 'st')
    if st == 'pending' or st == 'running' then
      live = live + 1
      redis.call('SADD', B .. 'kids:' .. parent, id)
      redis.call('HSET', B .. 'j:' .. parent, 'hk', 1)
    elseif st ~= 'done' and ARGV[a + 9] ~= '1' and not failed_by then
      failed_by, how = parent, st
    end
  end
  -- A waiting job is not due yet, whatever its own time, as a client's exit sees it
  -- (c:<client> scored at WAITING until release_kids scores it with its due time).
  local WAITING = 9007199254740991
  if failed_by then
    redis.call('HSET', B .. 'j:' .. id, 'wn', 1)  -- waiting, for dep_fail
    dep_fail(id, failed_by, how, ttl_ms, keep_ms, now, outbox)
  elseif live > 0 then
    redis.call('HSET', B .. 'j:' .. id, 'wn', live)
    redis.call('ZADD', B .. 'c:' .. client, WAITING, id)
  else
    redis.call('ZADD', B .. 'c:' .. client, due, id)
    local m = member(level, seq, id)
    redis.call('ZADD', B .. 'due', due, m)
    if head()[1] == m then wake() end
  end
end
send_outbox(outbox, now)
write_bytes()
return 1
