-- Undo claims whose answer never reached their manager (it timed out, or the connection
-- was lost on the way back, and the server ran them after all): each job that one of
-- them leased to `me` and that is still running under it goes back to the queue, its
-- attempt not counted (no worker ever had it). Called once the server answers again,
-- so every such claim has run by then, or never will.
--
-- ARGV: B, me, ttl_ms, keep_ms, {claim} *
-- Returns the ids of the jobs put back.
local me = ARGV[2]
local ttl_ms = tonumber(ARGV[3])
local keep_ms = tonumber(ARGV[4])
local doubtful = {}
for k = 5, #ARGV do doubtful[ARGV[k]] = true end
local now = now_us()
local back = {}
local new_head = false
for _, id in ipairs(redis.call('SMEMBERS', B .. 'l:' .. me)) do
  local f = redis.call('HMGET', B .. 'j:' .. id, 'cl', 'm', 'st')
  if f[1] and doubtful[f[1]] and f[2] == me and f[3] == 'running' then
    local put = requeue(id, nil, '0', ttl_ms, keep_ms, now)
    if put == 2 then new_head = true end
    if put > 0 then back[#back + 1] = id end
  end
end
if new_head then wake() end
write_bytes()
return back
