"""The Redis store's Lua scripts: each a single atomic step, one round trip.

Keys (``P`` is the store's prefix): ``P:r:ID`` a hash (``status``, ``expires_at``, ``body``,
``prev``), ``P:e:ID`` a sorted set of events scored by sequence number, and two sorted sets
of ids, ``P:by_created`` (the row cap evicts the oldest) and ``P:by_expiry``.
"""

# KEYS: record, events, by_created, by_expiry.
# ARGV: id, status, allowed previous statuses (space-separated), body, prev, created_at,
#       expires_at, ttl_ms. Returns the stored status when the transition is refused.
PUT = """
local current = redis.call('HGET', KEYS[1], 'status')
if current and not string.find(' ' .. ARGV[3] .. ' ', ' ' .. current .. ' ', 1, true) then
    return current
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'body', ARGV[4], 'prev', ARGV[5],
           'expires_at', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('PEXPIRE', KEYS[2], ARGV[8])
end
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[7], ARGV[1])
return false
"""

# KEYS: record, events. ARGV: now, then score/member pairs. Returns 0 if the response is
# not stored (or expired), else 1; the events expire with their response.
APPEND_EVENTS = """
local expires_at = redis.call('HGET', KEYS[1], 'expires_at')
if not expires_at or tonumber(expires_at) <= tonumber(ARGV[1]) then
    return 0
end
for i = 2, #ARGV, 2 do
    redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[i], ARGV[i])
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i + 1])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
"""

# ARGV: prefix, id, max depth. Walks previous ids inside Redis, newest first: returns the
# bodies with their expiry, then a last pair {'', id} naming the first id not stored.
CHAIN = """
local out = {}
local id = ARGV[2]
for _ = 1, tonumber(ARGV[3]) do
    local row = redis.call('HMGET', ARGV[1] .. ':r:' .. id, 'body', 'expires_at', 'prev')
    if not row[1] then
        table.insert(out, '')
        table.insert(out, id)
        return out
    end
    table.insert(out, row[1])
    table.insert(out, row[2])
    if not row[3] or row[3] == '' then
        return out
    end
    id = row[3]
end
return out
"""
