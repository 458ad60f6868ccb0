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
-- Then three per request: the index in KEYS of its key's counter (0: no key budget),
--          its caller's deadline on Redis's clock in Unix milliseconds (0: none), and
--          its cost, a positive number of units.
-- Returns {status, now, org, month, key…}: status 0, or -2 when the month counter
-- was missing and nothing was counted (then nothing follows now); now Redis's clock
-- in Unix milliseconds; then the org's minute count, the month's count and each key
-- counter's, in the order of KEYS, as they stood before this call.
--
-- The budgets are taken in order: each key's minute, the org's minute, the org's
-- month. A request passes a budget when its cost fits in what the budget has left,
-- and counts its whole cost there. Otherwise it is refused, and no budget after it
-- counts it. A minute window counts every request that reaches it, a refused one too,
-- except one refused while the window still had units left: that one counts nothing,
-- so that it does not spend the units a cheaper request may still use. The month
-- counts only what passes.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local orgLimit, monthLimit = tonumber(ARGV[4]), tonumber(ARGV[5])
local K = #KEYS
if orgLimit > 0 or monthLimit > 0 then
	K = K - 2
end
local orgKey, monthKey = KEYS[K + 1], KEYS[K + 2]
local first = 6 + K -- the first request's first argument

-- The live requests, in order: their key counter's index and cost. A request is live
-- when its deadline is 0 or not before now. added: each key counter's live units.
local keyOf, cost, added, live = {}, {}, {}, 0
for a = first, #ARGV, 3 do
	local deadline = tonumber(ARGV[a + 1])
	if deadline <= 0 or now <= deadline then
		live = live + 1
		local k, c = tonumber(ARGV[a]), tonumber(ARGV[a + 2])
		keyOf[live], cost[live] = k, c
		added[k] = (added[k] or 0) + c
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

-- count adds units to counter optimistically and returns what it held before: one
-- command whether or not every request passes; refund gives back what did not.
local function count(counter, units)
	local after = redis.call("INCRBY", counter, units)
	if after == units then
		-- The first requests of a window create its counter: make it expire.
		redis.call("PEXPIRE", counter, ARGV[1])
	end
	return after - units
end
local function refund(counter, units)
	if units > 0 then
		redis.call("DECRBY", counter, units)
	end
end

-- (a) Each key's minute.
local passed, keyAt, keyBefore = {}, {}, {}
for k = 1, K do
	local before = 0
	if added[k] then
		before = count(KEYS[k], added[k])
	end
	keyBefore[k], keyAt[k] = before, before
	out[#out + 1] = before
end
local units = 0 -- of the requests the key's minute let through
for r = 1, live do
	local k, c = keyOf[r], cost[r]
	if k == 0 then
		passed[r] = true
	else
		local left = tonumber(ARGV[5 + k]) - keyAt[k]
		passed[r] = c <= left
		if passed[r] or left <= 0 then
			keyAt[k] = keyAt[k] + c
		end
	end
	if passed[r] then
		units = units + c
	end
end
for k = 1, K do
	if added[k] then
		refund(KEYS[k], added[k] - (keyAt[k] - keyBefore[k]))
	end
end

-- (b) The org's minute, for what the keys' let through.
if orgLimit > 0 and live > 0 then
	local org
	if units > 0 then
		org = count(orgKey, units)
	else
		org = tonumber(redis.call("GET", orgKey) or "0")
	end
	out[3] = org
	local at, through = org, 0
	for r = 1, live do
		if passed[r] then
			local left = orgLimit - at
			passed[r] = cost[r] <= left
			if passed[r] or left <= 0 then
				at = at + cost[r]
			end
			if passed[r] then
				through = through + cost[r]
			end
		end
	end
	if units > 0 then
		refund(orgKey, units - (at - org))
	end
	units = through
end

-- (c) The month counts only what it lets through.
if monthLimit > 0 and units > 0 then
	local at = month
	for r = 1, live do
		if passed[r] and at + cost[r] <= monthLimit then
			at = at + cost[r]
		end
	end
	if at > month then
		redis.call("INCRBY", monthKey, at - month)
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
