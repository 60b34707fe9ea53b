-- Shared by every script (prepended to each). ARGV[1] is the deployment's key base,
-- "{prefix}:"; every key is that base and a name, so all of them hash to one slot.
local B = ARGV[1]

-- Microseconds on the server's clock: the only clock any script compares.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A member of the due set: jobs of equal due time sort by priority level, then seq.
local function member(level, seq, id)
  return level .. string.format('%016d', tonumber(seq)) .. ':' .. id
end

-- The list kept under ``key`` in ``map``, made empty on first use.
local function list_in(map, key)
  local list = map[key]
  if not list then
    list = {}
    map[key] = list
  end
  return list
end

-- Ask one waiting manager to look at the queue again (its head changed, or the timed
-- waiter left); every manager's subscriber hears it.
local function wake()
  redis.call('PUBLISH', B .. 'wake', '1')
end

-- Named queues: the default queue's jobs wait in `due` (and `rdy`), those of queue Q in
-- `q:Q:due` (and `q:Q:rdy`); `queues` is the set of the named queues ever used. A job's
-- hash names its queue (field q) and its limit (field lim) only when it has one.
local function qkey(q)
  if not q or q == '' then return B end
  return B .. 'q:' .. q .. ':'
end

-- The key prefix of every queue: the default one's first.
local function all_queues()
  local keys = {B}
  for _, q in ipairs(redis.call('SMEMBERS', B .. 'queues')) do keys[#keys + 1] = qkey(q) end
  return keys
end

-- order="priority": the jobs already due wait in `rdy` instead, scored by priority level,
-- member = due time in µs (16 digits; one before 1970 as 0) .. seq (16 digits) .. ":" ..
-- id, so that they sort by (level, due, seq). A claim moves them there from `due` as
-- they come due (promote); with order="time" `rdy` stays empty. Every other script puts
-- a pending job (back) in `due`: the next claim moves it on if it is due.
local function ready_member(due, seq, id)
  local at = tonumber(due)
  if at < 0 then at = 0 end
  return string.format('%016d%016d:', at, tonumber(seq)) .. id
end

-- A member of `rdy` as the due set would hold it: {member, due time in µs}.
local function ready_entry(m)
  return m, tonumber(string.sub(m, 1, 16))
end

-- Move every job due by `now` from `due` to `rdy` (each once: it leaves `due`), in the
-- queue of key prefix `qk` (default: the default queue).
local CHUNK = 1000
local function promote(now, qk)
  qk = qk or B
  local moved
  repeat
    local due = redis.call('ZRANGEBYSCORE', qk .. 'due', '-inf', now, 'WITHSCORES',
                           'LIMIT', 0, CHUNK)
    moved = #due / 2
    if moved == 0 then return end
    local ready = {}
    for k = 1, #due, 2 do
      local m = due[k]
      ready[k] = string.sub(m, 1, 1)
      ready[k + 1] = ready_member(due[k + 1], string.sub(m, 2, 17), string.sub(m, 19))
    end
    redis.call('ZADD', qk .. 'rdy', unpack(ready))
    redis.call('ZREMRANGEBYRANK', qk .. 'due', 0, moved - 1)
  until moved < CHUNK
end

-- Move every job of `rdy` back to `due` (the store's order becomes "time"), in the
-- queue of key prefix `qk`.
local function demote_queue(qk)
  local moved
  repeat
    local ready = redis.call('ZRANGE', qk .. 'rdy', 0, CHUNK - 1, 'WITHSCORES')
    moved = #ready / 2
    if moved == 0 then return end
    local due = {}
    for k = 1, #ready, 2 do
      local id = string.sub(ready[k], 34)
      -- the exact due time (the member's is 0 for one before 1970)
      due[k] = redis.call('HGET', B .. 'j:' .. id, 'd')
               or tonumber(string.sub(ready[k], 1, 16))
      due[k + 1] = member(ready[k + 1], string.sub(ready[k], 17, 32), id)
    end
    redis.call('ZADD', qk .. 'due', unpack(due))
    redis.call('ZREMRANGEBYRANK', qk .. 'rdy', 0, moved - 1)
  until moved < CHUNK
end

local function demote_all()
  for _, qk in ipairs(all_queues()) do demote_queue(qk) end
end

-- Take a pending job out of the queue, wherever it waits (its queue, or parked behind
-- its limit); 1 if it was there.
local function unqueue(id, level, seq)
  local m = member(level, seq, id)
  if redis.call('ZREM', B .. 'due', m) == 1 then return 1 end
  local f = redis.call('HMGET', B .. 'j:' .. id, 'd', 'q', 'lim')
  if not f[1] then return 0 end
  local qk = qkey(f[2])
  if f[2] and redis.call('ZREM', qk .. 'due', m) == 1 then return 1 end
  if redis.call('ZREM', qk .. 'rdy', ready_member(f[1], seq, id)) == 1 then return 1 end
  if f[3] then return redis.call('ZREM', B .. 'lim:' .. f[3] .. ':park', m) end
  return 0
end

-- Limits: the hash `limits` holds each one's bounds as "concurrency,count,window_us" (an
-- empty part: no such bound); `lim:N:run` counts the jobs of limit N that hold a slot
-- (their field ls), `lim:N:starts` its recent starts (score: µs), `lim:N:park` its jobs
-- parked while it is full (members and scores as in a due set), and `lim-opens` when
-- each full rate window with parked jobs opens (score: µs; member: the limit's name).
local function limit_bounds(name)
  local form = redis.call('HGET', B .. 'limits', name)
  if not form then return nil, nil, nil end
  local c, n, w = string.match(form, '^(%d*),(%d*),(%d*)$')
  return tonumber(c), tonumber(n), tonumber(w)
end

-- How many more jobs of limit `name` may start now (a large number: no bound).
local function limit_room(name, now)
  local c, n, w = limit_bounds(name)
  local room = 1000000000
  if c then room = c - tonumber(redis.call('GET', B .. 'lim:' .. name .. ':run') or 0) end
  if n then
    local sk = B .. 'lim:' .. name .. ':starts'
    redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - w)
    local left = n - redis.call('ZCARD', sk)
    if left < room then room = left end
  end
  return room
end

-- When the full rate window of limit `name` opens (nil: it has room, or no rate).
local function window_opens(name, now)
  local _, n, w = limit_bounds(name)
  if not n then return nil end
  local sk = B .. 'lim:' .. name .. ':starts'
  redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - w)
  if redis.call('ZCARD', sk) < n then return nil end
  local nth = redis.call('ZRANGE', sk, -n, -n, 'WITHSCORES')
  return tonumber(nth[2]) + w
end

local function note_window(name, now)
  local opens = window_opens(name, now)
  if opens and redis.call('ZCARD', B .. 'lim:' .. name .. ':park') > 0 then
    redis.call('ZADD', B .. 'lim-opens', opens, name)
  end
end

-- Take a slot of limit `name` for job `id`, which starts now; false when it is full.
local function admit(name, id, now)
  if limit_room(name, now) <= 0 then return false end
  local c, n = limit_bounds(name)
  if c then
    redis.call('INCR', B .. 'lim:' .. name .. ':run')
    redis.call('HSET', B .. 'j:' .. id, 'ls', '1')
  end
  if n then
    redis.call('ZADD', B .. 'lim:' .. name .. ':starts', now, id .. '@' .. now)
    note_window(name, now)
  end
  return true
end

-- A due job of a full limit waits parked (`score` and `m`: its place in a due set).
local function park(name, score, m, now)
  redis.call('ZADD', B .. 'lim:' .. name .. ':park', score, m)
  note_window(name, now)
end

-- As many parked jobs of limit `name` as it has room for back in their queues (due as
-- they were: first among what is due); true if any went.
local function unpark(name, now)
  local pk = B .. 'lim:' .. name .. ':park'
  local room = limit_room(name, now)
  if room <= 0 then
    note_window(name, now)
    return false
  end
  if room > 1000 then room = 1000 end
  local parked = redis.call('ZRANGE', pk, 0, room - 1, 'WITHSCORES')
  if #parked == 0 then return false end
  for k = 1, #parked, 2 do
    local q = redis.call('HGET', B .. 'j:' .. string.sub(parked[k], 19), 'q')
    redis.call('ZADD', qkey(q) .. 'due', parked[k + 1], parked[k])
  end
  redis.call('ZREMRANGEBYRANK', pk, 0, #parked / 2 - 1)
  return true
end

-- A job of limit `lim` ended or went back: its slot frees (if it held one: `ls`), and the
-- next parked jobs of that limit go back to their queues, the takers woken.
local function free_slot(jk, lim, ls, now)
  if ls then
    redis.call('HDEL', jk, 'ls')
    local rk = B .. 'lim:' .. lim .. ':run'
    if redis.call('DECR', rk) < 0 then redis.call('SET', rk, 0) end
  end
  if unpark(lim, now) then wake() end
end

-- How many jobs are pending (max_pending counts them all: parked ones too).
local function pending_count()
  local count = redis.call('ZCARD', B .. 'due') + redis.call('ZCARD', B .. 'rdy')
  if redis.call('EXISTS', B .. 'queues', B .. 'limits') == 0 then return count end
  for _, q in ipairs(redis.call('SMEMBERS', B .. 'queues')) do
    count = count + redis.call('ZCARD', qkey(q) .. 'due') + redis.call('ZCARD', qkey(q) .. 'rdy')
  end
  for _, name in ipairs(redis.call('HKEYS', B .. 'limits')) do
    count = count + redis.call('ZCARD', B .. 'lim:' .. name .. ':park')
  end
  return count
end

-- The head of a queue's due set (`qk`: its key prefix; default: the default queue's),
-- as {member, score}, or an empty table; with `ready` (order="priority"), the first job
-- of its `rdy` if any, as {member, its due time}.
local function head(ready, qk)
  qk = qk or B
  if ready then
    local top = redis.call('ZRANGE', qk .. 'rdy', 0, 0)
    if top[1] then return {ready_entry(top[1])} end
  end
  return redis.call('ZRANGE', qk .. 'due', 0, 0, 'WITHSCORES')
end

-- The payload bytes of pending jobs, across managers: the field 'pending_bytes' of
-- {p}:stats, what max_pending_bytes bounds (each pending job's stored payload, `p`).
-- Whatever moves a job into or out of the due set counts its payload with count_bytes;
-- the script writes the sum of its changes once, with write_bytes, before it returns.
local changed_bytes = 0

local function count_bytes(delta)
  changed_bytes = changed_bytes + delta
end

-- The size of a job's stored payload, without reading it.
local function payload_bytes(id)
  return redis.call('HSTRLEN', B .. 'j:' .. id, 'p')
end

local function write_bytes()
  if changed_bytes ~= 0 then
    redis.call('HINCRBY', B .. 'stats', 'pending_bytes', changed_bytes)
    changed_bytes = 0
  end
end

-- A job's end as a message on a manager's channel: "E" then each field as its length,
-- ":" and itself (id, state, client, crashed worker, outcome).
local function ended_message(id, state, client, crashed, outcome)
  local parts = {'E'}
  for _, field in ipairs({id, state, client, crashed or '', outcome or ''}) do
    parts[#parts + 1] = #field .. ':'
    parts[#parts + 1] = field
  end
  return table.concat(parts)
end

-- Tell the managers that deliver a job's end to clients: its owner (the manager its
-- client submitted through) and those whose clients watch it (`watched`: any do). A
-- small end goes whole in a message on each one's channel; one that no subscriber took
-- (or a large one), or for a manager not live, goes by id to its inbox list, with a "1"
-- on its channel when that list was empty. With an `outbox` (see send_outbox), the messages of one call wait there and
-- go as one message per manager at its end. Returns 1 when `me` is one of them (it
-- delivers the end itself, straight away), and whether another is.
local function live(m, outbox)
  if not outbox then return redis.call('ZSCORE', B .. 'managers', m) end
  if outbox.live[m] == nil then
    outbox.live[m] = redis.call('ZSCORE', B .. 'managers', m) ~= false
  end
  return outbox.live[m]
end

-- A manager that is not live (presumed dead, maybe only paused) finds the end in its
-- inbox if it comes back, kept as long as an ended job (INBOX_KEEP_MS at least).
local INBOX_KEEP_MS = 3600000
local function keep_for_absent(m, id)
  local inbox = B .. 'in:' .. m
  if redis.call('RPUSH', inbox, id) == 1 then
    redis.call('PUBLISH', B .. 'ch:' .. m, '1')
  end
  redis.call('PEXPIRE', inbox, INBOX_KEEP_MS)
end

local function notify(id, owner, me, watched, message, outbox)
  local mine = 0
  local targets = {}
  if watched then
    targets = redis.call('SMEMBERS', B .. 'w:' .. id)
    redis.call('DEL', B .. 'w:' .. id)
  end
  if owner then targets[#targets + 1] = owner end
  local told = {}
  for _, m in ipairs(targets) do
    if m == me then
      mine = 1
    elseif not told[m] and not live(m, outbox) then
      told[m] = true
      keep_for_absent(m, id)
    elseif not told[m] then
      told[m] = true
      if message and outbox then
        local box = outbox.boxes[m]
        if not box then
          box = {text = {'E'}, ids = {}}
          outbox.boxes[m] = box
        end
        box.text[#box.text + 1] = string.sub(message, 2)
        box.ids[#box.ids + 1] = id
      elseif not message or redis.call('PUBLISH', B .. 'ch:' .. m, message) == 0 then
        if redis.call('RPUSH', B .. 'in:' .. m, id) == 1 then
          redis.call('PUBLISH', B .. 'ch:' .. m, '1')
        end
      end
    end
  end
  return mine, next(told) ~= nil
end

-- An outbox: what the finishes of one call change besides each job's hash, written once
-- at its end by send_outbox (notify's messages by manager, leases ended by manager,
-- counts by state, ids ended), and which managers are live.
local function new_outbox()
  return {boxes = {}, live = {}, leases = {}, states = {}, ended = {}}
end

-- Write what an outbox holds: each manager's ends in one message (their fields one after
-- the other), or by id to its inbox if no subscriber of its took it.
local function send_outbox(outbox, now)
  for m, ids in pairs(outbox.leases) do
    redis.call('SREM', B .. 'l:' .. m, unpack(ids))
  end
  for state, count in pairs(outbox.states) do
    redis.call('HINCRBY', B .. 'stats', state, count)
  end
  if #outbox.ended > 0 then
    local scored = {}
    for _, id in ipairs(outbox.ended) do
      scored[#scored + 1] = now
      scored[#scored + 1] = id
    end
    redis.call('ZADD', B .. 'ended', unpack(scored))
  end
  for m, box in pairs(outbox.boxes) do
    if redis.call('PUBLISH', B .. 'ch:' .. m, table.concat(box.text)) == 0 then
      if redis.call('RPUSH', B .. 'in:' .. m, unpack(box.ids)) == #box.ids then
        redis.call('PUBLISH', B .. 'ch:' .. m, '1')
      end
    end
  end
end

-- Ends small enough to travel whole in a channel message (a subscriber's output buffer
-- is limited: 8 MiB by default).
local INLINE = 16384

-- Keep an ended job for ttl_ms (its record, outcome and key), then Redis forgets it.
-- Another manager's inbox names it: it is kept at least keep_ms, long enough to be read.
local function retire(id, key, ttl_ms, others, keep_ms, now, outbox)
  local jk = B .. 'j:' .. id
  local ttl = ttl_ms
  if others and ttl < keep_ms then ttl = keep_ms end
  if ttl > 0 then redis.call('PEXPIRE', jk, ttl) else redis.call('DEL', jk) end
  if key and redis.call('GET', B .. 'k:' .. key) == id then
    if ttl_ms > 0 then redis.call('PEXPIRE', B .. 'k:' .. key, ttl_ms)
    else redis.call('DEL', B .. 'k:' .. key) end
  end
  if outbox then
    outbox.ended[#outbox.ended + 1] = id
  else
    redis.call('ZADD', B .. 'ended', now, id)
  end
end

-- Jobs that wait for others (after=, ResultOf). A child's hash holds `wn`, how many of
-- its parents have not ended, and it stays out of `due` meanwhile; `wa` = 1 when it runs
-- even after a failed parent; `wr` the parents whose outcomes its arguments take. A
-- parent's hash holds `hk` = 1 once it has children, which `kids:<parent>` lists. A
-- parent's end counts each child down, in the script that ends it: at zero the child
-- enters `due` at its own due time, or now. A parent that failed or was cancelled fails
-- its children (those without `wa`) at once, their `x` field saying why (AFTER, the
-- parent's id, "|", how it ended), and their ends count their own children down in turn.
local AFTER = 'after:'

-- Fail a waiting child whose parent ended badly; told to every manager that delivers
-- it, the caller's too (by its channel). False when it was no longer waiting.
local function dep_fail(id, parent, how, ttl_ms, keep_ms, now, outbox)
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 'st', 'pr', 'c', 'o', 'wd', 'wn')
  if f[1] ~= 'pending' or not f[6] then return false end
  local mark = AFTER .. parent .. '|' .. how
  count_bytes(-payload_bytes(id))
  redis.call('HSET', jk, 'st', 'failed', 'f', now, 'x', mark)
  redis.call('HDEL', jk, 'p', 'wn')
  redis.call('ZREM', B .. 'c:' .. f[3], id)
  redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[2], -1)
  redis.call('HINCRBY', B .. 'stats', 'failed', 1)
  local _, others = notify(id, f[4], '', f[5], ended_message(id, 'failed', f[3], mark, nil),
                           outbox)
  retire(id, false, ttl_ms, others, keep_ms, now, outbox)
  return true
end

-- A parent ended (ok, or how it failed): count its children down, release those whose
-- last parent it was, fail those that do not allow its failure, and so on down.
local function release_kids(id, ok, how, ttl_ms, keep_ms, now, outbox)
  local work = {{id, ok, how}}
  local k = 1
  while k <= #work do
    local parent, parent_ok, parent_how = work[k][1], work[k][2], work[k][3]
    k = k + 1
    local kk = B .. 'kids:' .. parent
    local kids = redis.call('SMEMBERS', kk)
    redis.call('DEL', kk)
    for _, kid in ipairs(kids) do
      local jk = B .. 'j:' .. kid
      local f = redis.call('HMGET', jk, 'st', 'wn', 'wa', 'pr', 's', 'd', 'c')
      if f[1] == 'pending' and f[2] then
        if not parent_ok and f[3] ~= '1' then
          if dep_fail(kid, parent, parent_how, ttl_ms, keep_ms, now, outbox) then
            work[#work + 1] = {kid, false, 'DependencyFailedError'}
          end
        elseif redis.call('HINCRBY', jk, 'wn', -1) <= 0 then
          redis.call('HDEL', jk, 'wn')
          local due = tonumber(f[6])
          if due < now then due = now end
          redis.call('HSET', jk, 'd', due)
          local m = member(f[4], f[5], kid)
          redis.call('ZADD', B .. 'due', due, m)
          redis.call('ZADD', B .. 'c:' .. f[7], due, kid)
          if head()[1] == m then wake() end
        end
      end
    end
  end
end

-- A failed attempt of a running job that runs again (its retry policy, or RetryLater),
-- if `token` is its lease's: back in the due set `end` microseconds from now on this
-- server's clock, with its retry state. `end` is "<delay_us> <cause> <retry state>"
-- (mpsched._store.redis.records.retry_end); the cause names the stats counter. The
-- attempt was counted by the claim that leased it. Returns 1, or 1 again for an end sent
-- again under the same lease (its first answer was lost), 0 for a stale lease.
local function retried(id, token, ending, now)
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 't', 'st', 'm', 'pr', 's', 'c', 'q', 'lim', 'ls')
  if f[1] ~= token then return 0 end
  if f[2] == 'pending' then return 1 end
  if f[2] ~= 'running' then return 0 end
  if f[8] then free_slot(jk, f[8], f[9], now) end  -- its next attempt takes a slot again
  local first = string.find(ending, ' ', 1, true)
  local second = string.find(ending, ' ', first + 1, true)
  local due = now + tonumber(string.sub(ending, 1, first - 1))
  redis.call('SREM', B .. 'l:' .. f[3], id)
  redis.call('HSET', jk, 'st', 'pending', 'd', due, 'rs', string.sub(ending, second + 1))
  redis.call('HINCRBY', B .. 'stats', 'retried:' .. string.sub(ending, first + 1, second - 1), 1)
  local m = member(f[4], f[5], id)
  local qk = qkey(f[7])
  redis.call('ZADD', qk .. 'due', due, m)
  redis.call('ZADD', B .. 'c:' .. f[6], due, id)
  redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[4], 1)
  count_bytes(payload_bytes(id))
  if head(nil, qk)[1] == m then wake() end
  return 1
end

-- End a running job's lease with an outcome, if `token` is its lease's: 0 when the
-- lease is stale (the job was taken back and given to another lease), else 1, or 2
-- when the caller (`me`) delivers the end itself. An end sent again under the lease that
-- recorded it (its first answer was lost) is 1 again, and changes nothing. A job a peer
-- failed as crashed when it took back the jobs of this lease's manager (presumed dead:
-- field x), and that never ran again, ran to this end after all: the end replaces the
-- failure, and its owner and watchers are told again (3). What else changes waits in
-- `outbox` (see send_outbox). A state "failed\n<retry state>" is a job with a retry
-- policy that failed for good: its retry state, with its final error, is kept too.
local function finish(id, token, state, outcome, me, ttl_ms, keep_ms, now, outbox)
  if state == 'pending' then return retried(id, token, outcome, now) end
  local retry = nil  -- a job with a retry policy that failed for good: "failed\n<state>"
  local cut = string.find(state, '\n', 1, true)
  if cut then state, retry = string.sub(state, 1, cut - 1), string.sub(state, cut + 1) end
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 't', 'st', 'o', 'k', 'm', 'c', 'wd', 'x', 'lim', 'ls',
                       'hk')
  if f[1] ~= token then return 0 end
  local revived = false
  if f[2] ~= 'running' then
    if f[2] == 'failed' and f[8] then
      revived = true
      redis.call('HDEL', jk, 'x')
      outbox.states['failed'] = (outbox.states['failed'] or 0) - 1
    elseif f[2] == 'done' or f[2] == 'failed' then
      return 1
    else
      return 0
    end
  end
  redis.call('HSET', jk, 'st', state, 'f', now, 'out', outcome)
  if retry then redis.call('HSET', jk, 'rs', retry) end
  -- A failed job keeps its payload while it is kept: it may be requeued by id.
  if state ~= 'failed' then redis.call('HDEL', jk, 'p') end
  if f[9] and not revived then free_slot(jk, f[9], f[10], now) end
  local leases = list_in(outbox.leases, f[5])
  leases[#leases + 1] = id
  outbox.states[state] = (outbox.states[state] or 0) + 1
  local message = nil
  if #outcome <= INLINE then message = ended_message(id, state, f[6], nil, outcome) end
  local mine, others = notify(id, f[3], me, f[7], message, outbox)
  retire(id, f[4], ttl_ms, others, keep_ms, now, outbox)
  if f[11] then release_kids(id, state == 'done', state, ttl_ms, keep_ms, now, outbox) end
  if revived then return 3 end
  return 1 + mine
end

-- A job taken out of the queue unrun (pending, or prefetched and never started): its end
-- is recorded as cancelled and told to its owner and watchers, except `me`, which tells
-- its own clients. Its level's pending count and its place in the queue (unqueue) are
-- the caller's.
local function cancelled_end(id, client, owner, key, watched, me, ttl_ms, keep_ms, now)
  local jk = B .. 'j:' .. id
  redis.call('HSET', jk, 'st', 'cancelled', 'f', now)  -- its payload stays: see finish()
  redis.call('HINCRBY', B .. 'stats', 'cancelled', 1)
  if key and redis.call('GET', B .. 'k:' .. key) == id then
    redis.call('DEL', B .. 'k:' .. key)
  end
  local mine, others = notify(id, owner, me, watched,
                              ended_message(id, 'cancelled', client, nil, nil))
  retire(id, false, ttl_ms, others, keep_ms, now)
  if redis.call('HGET', jk, 'hk') then
    release_kids(id, false, 'cancelled', ttl_ms, keep_ms, now, nil)
  end
  return mine
end

-- The manager whose cancel waits for a prefetched job (the `cx` field: "nonce|manager").
local function canceller(cx)
  return string.sub(cx, string.find(cx, '|', 1, true) + 1)
end

-- Put a running job back in the due set with its due time and seq (first among what is
-- due), if `token` is its lease's. `retry` is '1' when this counts as an attempt (its
-- worker had it), '0' when it never started: then, if a cancel waits for it (it was
-- prefetched: see cancel.lua), it is cancelled instead. Returns 1 if it went back, 2 if
-- it became the head, 3 if it was cancelled, 4 if it was back already under this token
-- (sent again: the first answer was lost), 0 for a stale lease. The caller writes the
-- payload bytes it put back (write_bytes).
local function requeue(id, token, retry, ttl_ms, keep_ms, now)
  local jk = B .. 'j:' .. id
  local f = redis.call('HMGET', jk, 't', 'st', 'm', 'pr', 's', 'd', 'c', 'a', 'cx', 'o', 'k',
                       'wd', 'q', 'lim', 'ls')
  if token and f[1] ~= token then return 0 end
  if f[2] == 'pending' and token then return 4 end  -- put back before: its answer was lost
  if f[2] ~= 'running' then return 0 end
  redis.call('SREM', B .. 'l:' .. f[3], id)
  if f[14] then free_slot(jk, f[14], f[15], now) end  -- a retry takes a slot again
  if retry == '0' and f[9] then
    cancelled_end(id, f[7], f[10], f[11], f[12], canceller(f[9]), ttl_ms, keep_ms, now)
    return 3
  end
  local fields = {'st', 'pending'}
  if retry == '0' then
    fields[3], fields[4] = 'a', tonumber(f[8]) - 1
  else
    redis.call('HINCRBY', B .. 'stats', 'retried', 1)
  end
  redis.call('HSET', jk, unpack(fields))
  local m = member(f[4], f[5], id)
  local qk = qkey(f[13])
  redis.call('ZADD', qk .. 'due', f[6], m)
  redis.call('ZADD', B .. 'c:' .. f[7], f[6], id)
  redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[4], 1)
  count_bytes(payload_bytes(id))
  if head(nil, qk)[1] == m then return 2 end
  return 1
end
