package limiter

import "github.com/redis/go-redis/v9"

// incrScript counts one request in a window's counter and returns the new count and
// Redis's clock. It runs as one atomic step on the Redis server, so concurrent gateways
// never lose or double a count, and it touches only KEYS[1], so it works on Redis
// Cluster.
//
// A count that arrives after its caller's deadline is not made: the caller has already
// given up on it (and, under limiter_failure open, let the request through), so writing
// it would count a request twice over, once as "not counted" and once in Redis.
var incrScript = redis.NewScript(`
-- KEYS[1]: the counter of one API key in one window.
-- ARGV[1]: how long the counter must live from now, in milliseconds: the rest of its
--          window and one window more. Relative, so that a gateway clock behind Redis's
--          cannot write a counter that is already expired.
-- ARGV[2]: the caller's deadline on Redis's clock, in Unix milliseconds; 0 for none.
-- Returns {count, now} with now Redis's clock in Unix milliseconds; count is -1 when the
-- deadline had passed and nothing was counted.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[2])
if deadline > 0 and now > deadline then
	return {-1, now}
end
local n = redis.call("INCR", KEYS[1])
if n == 1 then
	-- The first request of a window creates the counter: make it expire on its own.
	redis.call("PEXPIRE", KEYS[1], ARGV[1])
end
return {n, now}
`)

// clockScript reads Redis's clock, in Unix milliseconds.
var clockScript = redis.NewScript(`
local t = redis.call("TIME")
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`)
