-- Drop from the listing indexes up to `n` ended jobs that Redis has forgotten (their
-- records expired after result_ttl), oldest first. Returns how many.
--
-- ARGV: B, n
local dropped = 0
for _, id in ipairs(redis.call('ZRANGE', B .. 'ended', 0, tonumber(ARGV[2]) - 1)) do
  if redis.call('EXISTS', B .. 'j:' .. id) == 0 then
    redis.call('ZREM', B .. 'all', id)
    redis.call('ZREM', B .. 'ended', id)
    dropped = dropped + 1
  end
end
return dropped
