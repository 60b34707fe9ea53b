-- List jobs in seq order: only those in `state` ('' for all), at most `limit` (0: no
-- limit). Jobs Redis has forgotten (expired) leave the index as they are met.
--
-- ARGV: B, state, limit
-- Returns, per job: its fields as in record() below, then a failed job's outcome (its
-- error is listed; false for any other job's).
local state = ARGV[2]
local limit = tonumber(ARGV[3])
local FIELDS = {'c', 'k', 'n', 'pr', 'd', 's', 'to', 'r', 'a', 'sub', 'st', 'w', 'f', 'x',
                'rs', 'pg', 'q', 'lim', 'wn'}
local out, gone = {}, {}
local start, CHUNK = 0, 500
while true do
  local ids = redis.call('ZRANGE', B .. 'all', start, start + CHUNK - 1)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', B .. 'j:' .. id, unpack(FIELDS))
    if not f[11] then
      gone[#gone + 1] = id
    elseif state == '' or f[11] == state then
      table.insert(f, 1, id)
      if f[12] == 'failed' then
        f[#FIELDS + 2] = redis.call('HGET', B .. 'j:' .. id, 'out')
      else
        f[#FIELDS + 2] = false
      end
      out[#out + 1] = f
      if limit > 0 and #out >= limit then break end
    end
  end
  if limit > 0 and #out >= limit then break end
  start = start + CHUNK
end
for _, id in ipairs(gone) do
  redis.call('ZREM', B .. 'all', id)
  redis.call('ZREM', B .. 'ended', id)
end
return out
