-- Put a failed or cancelled job back in the queue by its id (Client.requeue), due now on
-- the server's clock, with no attempt made: its id, seq, priority, payload, timeout,
-- retries, key and retry policy stay, its end and lease are forgotten, and its end will go to
-- `client`, a client of `me`. The record is kept again for good (its TTL is removed).
--
-- ARGV: B, me, id, client
-- Returns 1 when it was put back, 2 when it became the head; else why not: its state
-- ('pending', 'running', 'done'), 'unknown', 'no-payload' or 'key' (another job holds
-- its key now).
local me, id, client = ARGV[2], ARGV[3], ARGV[4]
local jk = B .. 'j:' .. id
local f = redis.call('HMGET', jk, 'st', 'pr', 's', 'k')
if not f[1] then return 'unknown' end
if f[1] ~= 'failed' and f[1] ~= 'cancelled' then return f[1] end
if redis.call('HEXISTS', jk, 'p') == 0 then return 'no-payload' end
if f[4] then
  local holder = redis.call('GET', B .. 'k:' .. f[4])
  if holder and holder ~= id then return 'key' end
  redis.call('SET', B .. 'k:' .. f[4], id)
end
local now = now_us()
redis.call('PERSIST', jk)
redis.call('HDEL', jk, 'f', 'out', 'x', 'w', 'm', 't', 'pf', 'cl', 'cx', 'wd', 'pg', 'sh')
redis.call('HSET', jk, 'st', 'pending', 'a', 0, 'd', now, 'c', client, 'o', me)
-- Its retry policy stays, without its earlier attempts' error and notes (field rs, JSON:
-- mpsched._core.retrying.RetryState); a state without a policy goes.
local rs = redis.call('HGET', jk, 'rs')
if rs then
  local ok, retry = pcall(cjson.decode, rs)
  if ok and type(retry) == 'table' and type(retry.policy) == 'table' then
    redis.call('HSET', jk, 'rs', cjson.encode({policy = retry.policy, error = cjson.null}))
  else
    redis.call('HDEL', jk, 'rs')
  end
end
redis.call('DEL', B .. 'w:' .. id)
redis.call('ZREM', B .. 'ended', id)
redis.call('ZADD', B .. 'all', f[3], id)
local m = member(f[2], f[3], id)
redis.call('ZADD', B .. 'due', now, m)
redis.call('ZADD', B .. 'c:' .. client, now, id)
redis.call('HINCRBY', B .. 'stats', 'pending:' .. f[2], 1)
count_bytes(payload_bytes(id))
write_bytes()
if head()[1] == m then
  wake()
  return 2
end
return 1
