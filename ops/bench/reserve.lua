-- Check-and-decrement on a hash {a = available, h = held}: the Redis baseline of ops/bench.sh.
local a = tonumber(redis.call('HGET', KEYS[1], 'a'))
if a and a >= 1 then
    redis.call('HINCRBY', KEYS[1], 'a', -1)
    redis.call('HINCRBY', KEYS[1], 'h', 1)
    return 1
end
return 0
