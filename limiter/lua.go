package limiter

import "github.com/redis/go-redis/v9"

// incrScript counts one request in a window's counter and returns the new count.
// It runs as one atomic step on the Redis server, so concurrent gateways never lose
// or double a count, and it touches only KEYS[1], so it works on Redis Cluster.
var incrScript = redis.NewScript(`
-- KEYS[1]: the counter of one API key in one window.
-- ARGV[1]: when the counter may be forgotten, in Unix milliseconds (after its window).
local n = redis.call("INCR", KEYS[1])
if n == 1 then
	-- The first request of a window creates the counter: make it expire on its own.
	redis.call("PEXPIREAT", KEYS[1], ARGV[1])
end
return n
`)
