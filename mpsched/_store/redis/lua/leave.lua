-- A manager leaves (it stopped): it holds no lease any more (its jobs ended or were
-- given back before), so it is simply forgotten, and gives up the lead if it held it.
--
-- ARGV: B, me
local me = ARGV[2]
redis.call('DEL', B .. 'l:' .. me, B .. 'm:' .. me, B .. 'in:' .. me)
redis.call('ZREM', B .. 'managers', me)
redis.call('ZREM', B .. 'idle', me)
if redis.call('GET', B .. 'leader') == me then
  redis.call('DEL', B .. 'leader')
  if head()[1] then wake() end
end
return 1
