-- Declare, change or forget a limit: its bounds as "concurrency,count,window_us" (see
-- common.lua), or '' to forget it. Parked jobs it now has room for go back to their
-- queues, and the takers are woken.
--
-- ARGV: B, name, bounds
local name, bounds = ARGV[2], ARGV[3]
if bounds == '' then
  redis.call('HDEL', B .. 'limits', name)
else
  redis.call('HSET', B .. 'limits', name, bounds)
end
redis.call('ZREM', B .. 'lim-opens', name)
if unpark(name, now_us()) then wake() end
return 1
