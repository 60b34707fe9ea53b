-- A manager leaves (it stopped): it is forgotten, and gives up the lead if it held it.
-- Its jobs ended or were given back before, as far as it knows; a job still leased to
-- it is one whose claim never reached it (the answer was lost), which no worker had: it
-- goes back to the queue, its attempt not counted. Nothing else will put it back.
--
-- ARGV: B, me, ttl_ms, keep_ms
-- Returns how many jobs went back.
local me = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local keep_ms = tonumber(ARGV[4])
local now = now_us()
local back = 0
for _, id in ipairs(redis.call('SMEMBERS', B .. 'l:' .. me)) do
  if redis.call('HGET', B .. 'j:' .. id, 'm') == me
      and requeue(id, nil, '0', ttl_ms, keep_ms, now) > 0 then
    back = back + 1
  end
end
write_bytes()
redis.call('DEL', B .. 'l:' .. me, B .. 'm:' .. me, B .. 'in:' .. me)
redis.call('ZREM', B .. 'managers', me)
redis.call('ZREM', B .. 'idle', me)
local led = redis.call('GET', B .. 'leader') == me
if led then redis.call('DEL', B .. 'leader') end
if (led or back > 0) and head()[1] then wake() end
return back
