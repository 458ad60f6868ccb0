package limiter

import "github.com/redis/go-redis/v9"

// countScript counts requests against their budgets, stage by stage as stages says,
// as one atomic step on the Redis server, so that each stage is exact across
// gateways. All the keys of one call share a Cluster hash slot: a key's own counter
// (a key without organisation budgets), or its organisation's (see Redis.Allow).
//
// One call may count several requests (a pipelined round gathers them): of one key,
// or of one organisation's keys. Each request meets the counts its predecessors in
// ARGV left. So at each stage the first requests its limit leaves room for pass. The
// script reads the requests once and counts each stage's total in one step.
//
// A count that arrives after its caller's deadline is not made. The caller has given
// up on it, and under limiter_failure open has let the request through. Writing it
// would count the request twice over: once as not counted, and once in Redis. The
// caller tells which requests those were by comparing each deadline with the now
// returned (see late).
//
// The script answers the counts as they stood before the call; from them the caller
// numbers each request with stages, as the script did. (An answer of four numbers per
// request would cost the caller an allocation each.)
//
// A missing month counter is the sign of a new month, or of a Redis that lost its
// data. Unless told what the month starts from, the script then counts nothing at
// all, so that the caller can read the month's count from its record and call again
// with it.
var countScript = redis.NewScript(`
-- KEYS[1], …, KEYS[K]: the minute counters of the keys counted, each once.
-- KEYS[K+1], KEYS[K+2]: the org's minute counter and its month counter, when the call
--          has an org budget (ARGV[4] or ARGV[5] positive); absent otherwise.
-- ARGV[1]: how long a minute counter must live from now, in milliseconds: the rest of
--          its window and one window more. Relative, so that a gateway clock behind
--          Redis's cannot write a counter that is already expired.
-- ARGV[2]: how long the month counter must live from now, in milliseconds: until a
--          day after the month's end.
-- ARGV[3]: what a missing month counter starts from; negative: count nothing, and
--          say so.
-- ARGV[4]: the org's minute limit; 0 for none.
-- ARGV[5]: the month's limit; 0 for none.
-- ARGV[6], …, ARGV[5+K]: the limit of each key counter, in the order of KEYS.
-- Then two per request: the index in KEYS of its key's counter (0: no key budget),
--          and its caller's deadline on Redis's clock in Unix milliseconds (0: none).
-- Returns {status, now, org, month, key…}: status 0, or -2 when the month counter
-- was missing and nothing was counted (then nothing follows now); now Redis's clock
-- in Unix milliseconds; then the org's minute count, the month's count and each key
-- counter's, in the order of KEYS, as they stood before this call.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local orgLimit, monthLimit = tonumber(ARGV[4]), tonumber(ARGV[5])
local K = #KEYS
if orgLimit > 0 or monthLimit > 0 then
	K = K - 2
end
local orgKey, monthKey = KEYS[K + 1], KEYS[K + 2]
local first = 6 + K -- the first request's first argument

-- The live requests of each key counter (index 0: those without a key budget). A
-- request is live when its deadline is 0 or not before now.
local added, live = {}, 0
for a = first, #ARGV, 2 do
	local deadline = tonumber(ARGV[a + 1])
	if deadline <= 0 or now <= deadline then
		local k = tonumber(ARGV[a])
		added[k] = (added[k] or 0) + 1
		live = live + 1
	end
end

local month = 0
if monthLimit > 0 and live > 0 then
	local v = redis.call("GET", monthKey)
	if v then
		month = tonumber(v)
	else
		local seed = tonumber(ARGV[3])
		if seed < 0 then
			return {-2, now}
		end
		month = seed
		redis.call("SET", monthKey, seed, "PX", ARGV[2])
	end
end
local out = {0, now, 0, month}

-- (a) The key's minute counts every live request; the first of a key's that its limit
-- leaves room for pass.
local passed = added[0] or 0
for k = 1, K do
	local n, before = added[k], 0
	if n then
		local after = redis.call("INCRBY", KEYS[k], n)
		if after == n then
			-- The first requests of a window create its counter: make it expire.
			redis.call("PEXPIRE", KEYS[k], ARGV[1])
		end
		before = after - n
		passed = passed + math.min(n, math.max(tonumber(ARGV[5 + k]) - before, 0))
	end
	out[#out + 1] = before
end

-- (b) The org's minute counts what the key's let through; the first it leaves room for
-- pass.
if orgLimit > 0 and live > 0 then
	local org
	if passed > 0 then
		org = redis.call("INCRBY", orgKey, passed)
		if org == passed then
			redis.call("PEXPIRE", orgKey, ARGV[1])
		end
		org = org - passed
	else
		org = tonumber(redis.call("GET", orgKey) or "0")
	end
	out[3] = org
	passed = math.min(passed, math.max(orgLimit - org, 0))
end

-- (c) The month counts only what it lets through.
if monthLimit > 0 then
	local n = math.min(passed, math.max(monthLimit - month, 0))
	if n > 0 then
		redis.call("INCRBY", monthKey, n)
	end
end
return out
`)

// late reports whether countScript, running at redisNow, refused the count of a
// request with this deadline.
func late(deadline, redisNow int64) bool {
	return deadline > 0 && redisNow > deadline
}

// clockScript reads Redis's clock, in Unix milliseconds.
var clockScript = redis.NewScript(`
local t = redis.call("TIME")
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`)
