-- Report and claim, in one call: end the leases of jobs that finished, put back those
-- whose lease was lost (or that a worker was handed and did not start), answer the
-- cancels that waited for those, then claim up to n due jobs for `worker` (or the
-- pending jobs named in `ids`), in (due, priority, seq) order on the server's clock
-- (or by priority first among due jobs: `order`, below).
--
-- ARGV: B, me, lease_ms, ttl_ms, keep_ms,
--       nf, {id, token, state, outcome} * nf,
--       nr, {id, token, retry} * nr,
--       na, {nonce} * na,
--       n, worker, early_us, span_ms, grace_ms, lead, waiting, ni, {id} * ni,
--       nq, {queue} * nq, claim, order
--
-- `queues`: the worker's queues in strict order (nq = 0: every queue; the one whose
-- head comes first first). A due job of a full limit is parked (park, in common.lua),
-- and the claim goes on to the next: it takes no lease, no attempt, no slot.
--
-- `claim` names this call (unique per manager): each job it leases keeps it (field cl),
-- so that a claim whose answer never reached the manager can be undone (unclaim.lua).
--
-- With order = 'priority' (the last argument), the jobs due by now are first moved to
-- `rdy` (promote, in common.lua) and claimed from there by (priority, due, seq); when
-- none is due, the claim goes on as with 'time', on the due set.
--
-- The first job claimed may be due within early_us from now: its lease says how long
-- until it is due (a duration, never an instant), and the worker waits that long itself.
-- The others are *prefetched* (marked pf): each is due now, has no timeout and is not a
-- schedule's run (its id has no "@"); the claim stops at the first that is not. Each
-- has a lease and a token of its own. Nothing is prefetched while another manager has
-- a taker waiting for work (the `idle` set: a manager is in it from a take that claims
-- nothing, or while `waiting` = '1': another taker of its waits, until a take of its
-- claims with none waiting; a mark lasts IDLE_MS at most, and leaves with its manager).
--
-- The ends of the jobs finished here go to each other manager that delivers them in one
-- message (send_outbox).
--
-- Returns {finished, requeued, jobs, head_us, leader, leader_ms, registered}:
--   finished, requeued: per report, finish()'s and requeue()'s result;
--   jobs: per claimed job {id, payload, delay_us, timeout, attempt, token, level, seq,
--         client, owner, retries, key, name, due_us, submitted_us[, retry]}; the payload
--         is '' for a job `me` holds in shared memory (its field sh: see submit.lua);
--         retry, a job's retry state (field rs), only for a job with a retry policy;
--   head_us: microseconds until the head is due (<= 0: due now), -1 for an empty queue;
--   leader: 1 when `me` is the timed waiter: lead = 'wait' asks for the lead (a taker
--         of `me` will wait if it claims nothing), 'give' gives it up, '' leaves it;
--         leader_ms: how long the current leader's lead lasts (-1: none), after which a
--         follower looks again;
--   registered: 0 when `me` is not a live manager (it was presumed dead and its leases
--         taken back): nothing was claimed; it must register again.
local me = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local ttl_ms = tonumber(ARGV[4])
local keep_ms = tonumber(ARGV[5])
local now = now_us()
local i = 6

local finished = {}
local outbox = new_outbox()
local nf = tonumber(ARGV[i]); i = i + 1
for k = 1, nf do
  finished[k] = finish(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], me, ttl_ms, keep_ms,
                       now, outbox)
  i = i + 4
end
send_outbox(outbox, now)

local requeued = {}
local new_head = false
local nr = tonumber(ARGV[i]); i = i + 1
for k = 1, nr do
  requeued[k] = requeue(ARGV[i], ARGV[i + 1], ARGV[i + 2], ttl_ms, keep_ms, now)
  if requeued[k] == 2 then new_head = true end
  i = i + 3
end

local na = tonumber(ARGV[i]); i = i + 1
for k = 0, na - 1 do
  local answer = B .. 'cr:' .. ARGV[i + k]
  redis.call('RPUSH', answer, '1')
  redis.call('PEXPIRE', answer, 60000)
end
i = i + na

local n = tonumber(ARGV[i])
local worker = ARGV[i + 1]
local early = tonumber(ARGV[i + 2])
local span_ms = tonumber(ARGV[i + 3])
local grace_ms = tonumber(ARGV[i + 4])
local lead = ARGV[i + 5]
local waiting = ARGV[i + 6] == '1'
local ni = tonumber(ARGV[i + 7]); i = i + 8
local asked_queues = {}
local nq = tonumber(ARGV[i + ni])
for k = 1, nq do asked_queues[k] = ARGV[i + ni + k] end
local by_priority = ARGV[#ARGV] == 'priority'
local claim_id = ARGV[#ARGV - 1]
local IDLE_MS = 60000

local registered = 1
if redis.call('ZSCORE', B .. 'managers', me) then
  redis.call('ZADD', B .. 'managers', 'XX', now + lease_ms * 1000, me)
else
  registered = 0
  n, ni, lead = 0, 0, ''
end

local function fields(id)
  return redis.call('HMGET', B .. 'j:' .. id, 'c', 'o', 'k', 'n', 'p', 'pr', 'd', 's', 'to',
                    'r', 'a', 'sub', 'sh', 'rs', 'lim')
end

-- What the leases of one call change besides each job's hash, written once at its end.
local leased = {ids = {}, members = {}, clients = {}, levels = {}}

local function lease(id, f, prefetched, token)
  local attempt = tonumber(f[11]) + 1
  redis.call('HSET', B .. 'j:' .. id, 'st', 'running', 'a', attempt, 't', token,
             'w', worker, 'm', me, 'pf', prefetched and '1' or '0', 'cl', claim_id)
  leased.ids[#leased.ids + 1] = id
  local ofclient = list_in(leased.clients, f[1])
  ofclient[#ofclient + 1] = id
  leased.levels[f[6]] = (leased.levels[f[6]] or 0) + 1
  count_bytes(-#f[5])
  local delay = tonumber(f[7]) - now
  if delay < 0 then delay = 0 end
  local payload = f[5]
  if f[13] == me then payload = '' end  -- its workers map the segment `me` keeps
  local row = {id, payload, delay, f[9], attempt, token, f[6], f[8], f[1], f[2], f[10], f[3],
               f[4], f[7], f[12]}
  if f[14] then row[16] = f[14] end
  return row
end

local jobs = {}
local parked_here = false  -- a job was parked by this call (a rate window may now open)
-- Jobs one call parks at most: a backlog behind a full limit is parked over several
-- claims (each answers that the head is due, so its taker claims again at once) rather
-- than in one script that would hold Redis for every manager meanwhile.
local PARK_MAX = 5000
local parked_count = 0

-- Claim up to `want` due jobs from the queue of key prefix `qk`, after those in `jobs`
-- (only the first of all may be due within `early`; the others are prefetched: due now,
-- no timeout, not a schedule's run). A job of a full limit is parked, and the next one
-- looked at. Returns true when it stopped at a job that may not be prefetched.
local function claim_from(qk, want)
  local got, more = 0, 0  -- more: past jobs of full limits, look at this many more at once
  while got < want do
    local due, set, cut = {}, qk .. 'due', 19
    if by_priority then
      promote(now, qk)
      for k, m in ipairs(redis.call('ZRANGE', qk .. 'rdy', 0, want - got + more - 1)) do
        due[2 * k - 1], due[2 * k] = ready_entry(m)
      end
      if #due > 0 then set, cut = qk .. 'rdy', 34 end
    end
    if #due == 0 then
      local until_ = now
      if #jobs == 0 then until_ = now + early end
      due = redis.call('ZRANGEBYSCORE', set, '-inf', until_, 'WITHSCORES', 'LIMIT', 0,
                       want - got + more)
    end
    if #due == 0 then return false end
    -- Tokens for every job it may claim at once (one it does not claim leaves a gap: a
    -- token need only be new).
    local token = redis.call('INCRBY', B .. 'token', #due / 2) - #due / 2
    local members, parked = {}, false
    local stop = false
    for k = 1, #due, 2 do
      if got >= want then break end
      local id = string.sub(due[k], cut)
      local f = fields(id)
      if #jobs > 0 and (tonumber(due[k + 1]) > now or (f[9] and f[9] ~= '')
                        or string.find(id, '@', 1, true)) then
        stop = true
        break
      end
      if f[15] and not admit(f[15], id, now) then
        redis.call('ZREM', set, due[k])
        local score, m = due[k + 1], due[k]
        if cut == 34 then score, m = f[7], member(f[6], f[8], id) end
        park(f[15], score, m, now)
        parked, parked_here = true, true
        parked_count = parked_count + 1
      else
        members[#members + 1] = due[k]
        token = token + 1
        jobs[#jobs + 1] = lease(id, f, #jobs > 0, token)
        got = got + 1
      end
    end
    if #members > 0 then redis.call('ZREM', set, unpack(members)) end
    if stop or parked_count >= PARK_MAX then return true end
    if not parked then return false end
    more = 256
  end
  return false
end

-- The key prefixes of the queues a claim looks at, in the order it looks: the worker's
-- own list, or (every queue) the one whose head comes first first.
-- Named queues, or rate windows with parked jobs: none on the plain path, one EXISTS.
local routed = redis.call('EXISTS', B .. 'queues', B .. 'lim-opens') > 0

local function served()
  if nq > 0 then
    local keys = {}
    for k, q in ipairs(asked_queues) do
      if q == 'default' then keys[k] = B else keys[k] = qkey(q) end
    end
    return keys
  end
  if not routed or redis.call('SCARD', B .. 'queues') == 0 then return {B} end
  local keys, firsts = all_queues(), {}
  for _, qk in ipairs(keys) do
    local top = head(by_priority, qk)
    firsts[qk] = top[1] and tonumber(top[2]) or math.huge
  end
  table.sort(keys, function(a, b) return firsts[a] < firsts[b] end)
  return keys
end

-- Rate windows that have opened let their parked jobs back in first.
if n > 0 and routed then
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', B .. 'lim-opens', '-inf', now)) do
    redis.call('ZREM', B .. 'lim-opens', name)
    unpark(name, now)
  end
end

local queues = served()
if ni > 0 then
  for k = 1, ni do
    local id = ARGV[i + k - 1]
    local f = redis.call('HMGET', B .. 'j:' .. id, 'st', 'pr', 's')
    if f[1] == 'pending' then
      unqueue(id, f[2], f[3])
      jobs[#jobs + 1] = lease(id, fields(id), false, redis.call('INCR', B .. 'token'))
    end
  end
elseif n > 0 then
  if n > 1 then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', B .. 'idle', now, '+inf', 'LIMIT', 0, 2)) do
      if m ~= me then n = 1 end
    end
  end
  for _, qk in ipairs(queues) do
    if #jobs >= n or claim_from(qk, n - #jobs) then break end
  end
end
if #jobs > 0 then
  redis.call('SADD', B .. 'l:' .. me, unpack(leased.ids))
  for client, ids in pairs(leased.clients) do
    redis.call('ZREM', B .. 'c:' .. client, unpack(ids))
  end
  for level, count in pairs(leased.levels) do
    redis.call('HINCRBY', B .. 'stats', 'pending:' .. level, -count)
  end
end

if n > 0 or ni > 0 then
  if waiting or (#jobs == 0 and lead == 'wait') then
    redis.call('ZADD', B .. 'idle', now + IDLE_MS * 1000, me)
  else
    redis.call('ZREM', B .. 'idle', me)
  end
end

local head_us = -1
for _, qk in ipairs(queues) do
  local top = head(by_priority, qk)
  if top[1] and (head_us == -1 or tonumber(top[2]) - now < head_us) then
    head_us = tonumber(top[2]) - now
  end
end
local opens = {}
if routed or parked_here then
  opens = redis.call('ZRANGE', B .. 'lim-opens', 0, 0, 'WITHSCORES')
end
if opens[1] and (head_us == -1 or tonumber(opens[2]) - now < head_us) then
  head_us = tonumber(opens[2]) - now
  if head_us < 0 then head_us = 0 end
end
local top = {head_us ~= -1}

-- Leadership: the one manager whose taker waits, timed, for the head to come due. A
-- manager that claimed what it waited for gives the lead up, and wakes another waiter
-- if work remains; one that claimed nothing and will wait takes it if it is free.
local leader_key = B .. 'leader'
local holder = redis.call('GET', leader_key)
local leader = 0
if #jobs > 0 or lead == 'give' then
  if holder == me then
    redis.call('DEL', leader_key)
    holder = false
    if top[1] then new_head = true end
  end
elseif top[1] and lead == 'wait' then
  local span = math.floor(head_us / 1000)
  if span > span_ms then span = span_ms end
  if span < 0 then span = 0 end
  if holder == me or not holder then
    redis.call('SET', leader_key, me, 'PX', span + grace_ms)
    holder = me
    leader = 1
  end
end
local leader_ms = -1
if holder and leader == 0 then leader_ms = redis.call('PTTL', leader_key) end
if new_head then wake() end
write_bytes()
return {finished, requeued, jobs, head_us, leader, leader_ms, registered}
