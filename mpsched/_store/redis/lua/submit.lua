-- Submit jobs, all or none, due on the server's clock.
--
-- ARGV: B, owner, if_absent, max_pending, max_bytes, n,
--       {id, client, key, name, payload, level, delay_us, at_us, timeout, retries} * n,
--       nh, {k} * nh [, nr, {k, retry} * nr [, nq, {k, queue, limit} * nq]]
-- (delay_us or at_us is "": a job is due after a delay from now on this server's clock,
-- or at a UTC instant; max_pending, a bound on pending jobs, and max_bytes, on the
-- payload bytes they hold, "" for no bound).
--
-- A job whose key another live or retained job holds is not added: its holder's id
-- stands for it (within the batch, the first job with a key). With if_absent = '1', a
-- job whose id exists already is not added either (a schedule's run armed twice): it
-- stands for itself while pending or running (and its end is told to `owner` too), and
-- as "" once it has ended; otherwise a known id fails the batch. With if_absent = '2'
-- (the batch is sent again: its first answer was lost), a known id stands for itself
-- whatever its state: the first one was taken.
--
-- The nh jobs numbered k (from 1, in the batch) are held by `owner` too: it keeps their
-- large buffers in shared memory, so its own claims take them without the payload (the
-- job's field `sh` names it). Jobs without large buffers pay nothing for this.
--
-- The nr jobs numbered k have a retry policy: `retry` is their retry state (JSON, see
-- mpsched._core.retrying.RetryState), kept in the job's field `rs`. A batch without any
-- leaves the list out.
--
-- The nq jobs numbered k go to a named queue ('' or 'default': the default one) and run
-- under a limit ('': none); every other job waits in the default queue, without one. A
-- batch with any sends the retry list too, empty or not.
--
-- Returns {holders, full}: for each job the id of the job that stands for it; full = 1
-- when the queue had no room for the batch under max_pending, 2 under max_bytes: nothing
-- was added.
local owner = ARGV[2]
local if_absent = ARGV[3] ~= '0'
local again = ARGV[3] == '2'
local max_pending = tonumber(ARGV[4])
local max_bytes = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local FIELDS = 10
local held = {}
local nh_at = 7 + n * FIELDS
for k = 1, tonumber(ARGV[nh_at]) do
  held[6 + (tonumber(ARGV[nh_at + k]) - 1) * FIELDS] = true  -- by the job's `at`, below
end
local retry_of = {}
local nr_at = nh_at + 1 + tonumber(ARGV[nh_at])
local nq_at = nil
if ARGV[nr_at] then
  for k = 1, tonumber(ARGV[nr_at]) do
    retry_of[6 + (tonumber(ARGV[nr_at + 2 * k - 1]) - 1) * FIELDS] = ARGV[nr_at + 2 * k]
  end
  nq_at = nr_at + 1 + 2 * tonumber(ARGV[nr_at])
end
local routes = {}  -- by the job's `at`: {queue, limit}
if nq_at and ARGV[nq_at] then
  for k = 1, tonumber(ARGV[nq_at]) do
    local r = nq_at + (k - 1) * 3
    local q = ARGV[r + 2]
    if q == 'default' then q = '' end
    routes[6 + (tonumber(ARGV[r + 1]) - 1) * FIELDS] = {q, ARGV[r + 3]}
  end
end

local holders, fresh, keys, ids = {}, {}, {}, {}
for k = 1, n do
  local at = 6 + (k - 1) * FIELDS
  local id, key = ARGV[at + 1], ARGV[at + 3]
  if ids[id] then
    return redis.error_reply('DUPLICATE a batch repeats job id ' .. id)
  end
  ids[id] = true
  local holder = nil
  local known = redis.call('HMGET', B .. 'j:' .. id, 'st', 'o')
  if known[1] then
    if not if_absent then
      return redis.error_reply('DUPLICATE job id ' .. id .. ' is already in the store')
    end
    holder = id
    if again then  -- it is this batch's own job, taken the first time
    elseif known[1] == 'pending' or known[1] == 'running' then
      -- armed by another manager too: this one hears of its end as well
      if known[2] ~= owner then
        redis.call('SADD', B .. 'w:' .. id, owner)
        redis.call('HSET', B .. 'j:' .. id, 'wd', 1)
      end
    else
      holder = ''  -- it ran (or was cancelled) already: it is not armed again
    end
  elseif key ~= '' then
    holder = keys[key]
    if not holder then
      local found = redis.call('GET', B .. 'k:' .. key)
      if found and redis.call('EXISTS', B .. 'j:' .. found) == 1 then holder = found end
    end
  end
  if holder then
    holders[k] = holder
  else
    holders[k] = id
    if key ~= '' then keys[key] = id end
    fresh[#fresh + 1] = at
  end
end

if max_pending and #fresh > 0 and pending_count() + #fresh > max_pending then
  return {holders, 1}
end
local size = 0
for _, at in ipairs(fresh) do size = size + #ARGV[at + 5] end
if max_bytes and size > 0 and size + tonumber(
    redis.call('HGET', B .. 'stats', 'pending_bytes') or 0) > max_bytes then
  return {holders, 2}
end
count_bytes(size)

local now = now_us()
local old = head()[1]
local seq = redis.call('INCRBY', B .. 'seq', #fresh) - #fresh
-- The index entries of every job, written once each at the end.
local due_set, all_set, by_client, levels = {}, {}, {}, {}
local named = {}  -- the due entries of named queues, by key prefix
local parked_at_once, room_of = {}, {}  -- by limit: entries parked; its room now
for _, at in ipairs(fresh) do
  seq = seq + 1
  local id, client, key = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local level = ARGV[at + 6]
  local due = now
  if ARGV[at + 8] ~= '' then due = tonumber(ARGV[at + 8])
  elseif ARGV[at + 7] ~= '' then due = now + tonumber(ARGV[at + 7]) end
  local fields = {'c', client, 'o', owner, 'n', ARGV[at + 4], 'p', ARGV[at + 5],
                  'pr', level, 'd', due, 's', seq, 'to', ARGV[at + 9], 'r', ARGV[at + 10],
                  'a', 0, 'sub', now, 'st', 'pending'}
  if held[at] then
    fields[#fields + 1] = 'sh'
    fields[#fields + 1] = owner
  end
  if retry_of[at] then
    fields[#fields + 1] = 'rs'
    fields[#fields + 1] = retry_of[at]
  end
  if key ~= '' then
    fields[#fields + 1] = 'k'
    fields[#fields + 1] = key
    redis.call('SET', B .. 'k:' .. key, id)
  end
  local route = routes[at]
  local entries = due_set
  if route then
    if route[1] ~= '' then
      fields[#fields + 1] = 'q'
      fields[#fields + 1] = route[1]
      redis.call('SADD', B .. 'queues', route[1])
      entries = list_in(named, qkey(route[1]))
    end
    if route[2] ~= '' then
      fields[#fields + 1] = 'lim'
      fields[#fields + 1] = route[2]
      -- Due now while its limit is full: parked at once, so that no claim looks at it
      -- before a slot frees (a backlog behind a limit costs its claims nothing).
      if room_of[route[2]] == nil then room_of[route[2]] = limit_room(route[2], now) end
      if due <= now and room_of[route[2]] <= 0 then
        entries = list_in(parked_at_once, route[2])
      end
    end
  end
  redis.call('HSET', B .. 'j:' .. id, unpack(fields))
  entries[#entries + 1] = due
  entries[#entries + 1] = member(level, seq, id)
  all_set[#all_set + 1] = seq
  all_set[#all_set + 1] = id
  local mine = list_in(by_client, client)
  mine[#mine + 1] = due
  mine[#mine + 1] = id
  levels[level] = (levels[level] or 0) + 1
end
-- ZADD takes at most a few thousand arguments at once from Lua (unpack's limit).
local function zadd(key, pairs_)
  for from = 1, #pairs_, 4000 do
    redis.call('ZADD', key, unpack(pairs_, from, math.min(from + 3999, #pairs_)))
  end
end
if #fresh > 0 then
  if #due_set > 0 then zadd(B .. 'due', due_set) end
  for qk, entries in pairs(named) do zadd(qk .. 'due', entries) end
  for name, entries in pairs(parked_at_once) do
    zadd(B .. 'lim:' .. name .. ':park', entries)
    note_window(name, now)
  end
  zadd(B .. 'all', all_set)
  for client, entries in pairs(by_client) do zadd(B .. 'c:' .. client, entries) end
  for level, count in pairs(levels) do
    redis.call('HINCRBY', B .. 'stats', 'pending:' .. level, count)
  end
end
redis.call('HINCRBY', B .. 'stats', 'submitted', #fresh)
write_bytes()
if #fresh > 0 and (head()[1] ~= old or next(routes) ~= nil) then wake() end
return {holders, 0}
