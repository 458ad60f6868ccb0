package limiter

import "github.com/redis/go-redis/v9"

// countScript counts requests against their budgets, stage by stage as stages says,
// as one atomic step on the Redis server, so that each stage is exact across
// gateways. All the keys of one call share a Cluster hash slot: a key's own counters
// (a key without organisation budgets), or its organisation's (see Redis.Allow).
//
// One call may count several requests (a pipelined round gathers them): of one key,
// or of one organisation's keys. Each request meets the counts its predecessors in
// ARGV left. So at each stage the first requests its limit leaves room for pass. The
// script reads the requests once and counts each window's total in one step.
//
// A count that arrives after its caller's deadline is not made. The caller has given
// up on it, and under limiter_failure open has let the request through. Writing it
// would count the request twice over: once as not counted, and once in Redis. The
// caller tells which requests those were by comparing each deadline with the now
// returned (see late).
//
// The script answers the counts as they stood before the call; from them the caller
// numbers each request with stages, as the script did. (An answer of several numbers
// per request would cost the caller an allocation each.)
//
// A missing month counter is the sign of a new month, or of a Redis that lost its
// data. Unless told what the month starts from, the script then counts nothing at
// all, so that the caller can read the month's count from its record and call again
// with it.
var countScript = redis.NewScript(`
-- KEYS: the window counters of the keys counted, each key once, each key's in the
--          order minute, second, hour, day (those it has); then the org's minute
--          counter and its month counter, when the call has an org budget (ARGV[4] or
--          ARGV[5] positive).
-- ARGV[1], ARGV[6], ARGV[7], ARGV[8]: how long a counter of a minute, a second, an
--          hour and a day must live from now, in milliseconds: the rest of its window
--          and one window more; 0 when the call has none of that span. Relative, so
--          that a gateway clock behind Redis's cannot write a counter that is already
--          expired.
-- ARGV[2]: how long the month counter must live from now, in milliseconds: until a
--          day after the month's end.
-- ARGV[3]: what a missing month counter starts from; negative: count nothing, and
--          say so.
-- ARGV[4]: the org's minute limit; 0 for none.
-- ARGV[5]: the month's limit; 0 for none.
-- ARGV[9]: E, how many keys the call counts. Then for each key: the spans of its
--          windows, a sum of 1 (minute), 2 (second), 4 (hour) and 8 (day), followed
--          by the limit of each, in the order of its counters in KEYS.
-- Then three per request: the index of its key among the E (0: no key budget), its
--          caller's deadline on Redis's clock in Unix milliseconds (0: none), and its
--          cost, a positive number of units.
-- Returns {status, now, org, month, counter…}: status 0, or -2 when the month counter
-- was missing and nothing was counted (then nothing follows now); now Redis's clock
-- in Unix milliseconds; then the org's minute count, the month's count and each key
-- counter's, in the order of KEYS, as they stood before this call.
--
-- The budgets are taken in order: each key's windows, the org's minute, the org's
-- month. A request passes a budget when its cost fits in what the budget has left, in
-- each of its windows, and counts its whole cost there. Otherwise it is refused, and no
-- budget after it counts it. A window counts every request that reaches it, a refused
-- one too, except one refused while the window still had units left: that one counts
-- nothing there, so that it does not spend the units a cheaper request may still use.
-- The month counts only what passes.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local orgLimit, monthLimit = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttlOf = {ARGV[1], ARGV[6], ARGV[7], ARGV[8]} -- by span: minute, second, hour, day

-- Each key's counters (indexes in KEYS) and their limits.
local counters, limits, ttl = {}, {}, {}
local a, K = 10, 0
for e = 1, tonumber(ARGV[9]) do
	local spans = tonumber(ARGV[a])
	a = a + 1
	local cs, ls = {}, {}
	for s = 1, 4 do
		if spans % 2 == 1 then
			K = K + 1
			cs[#cs + 1], ls[#ls + 1], ttl[K] = K, tonumber(ARGV[a]), ttlOf[s]
			a = a + 1
		end
		spans = math.floor(spans / 2)
	end
	counters[e], limits[e] = cs, ls
end
local orgKey, monthKey = KEYS[K + 1], KEYS[K + 2]

-- The live requests, in order: their key and cost. A request is live when its
-- deadline is 0 or not before now. added: each key's live units.
local keyOf, cost, added, live = {}, {}, {}, 0
for r = a, #ARGV, 3 do
	local deadline = tonumber(ARGV[r + 1])
	if deadline <= 0 or now <= deadline then
		live = live + 1
		local e, c = tonumber(ARGV[r]), tonumber(ARGV[r + 2])
		keyOf[live], cost[live] = e, c
		added[e] = (added[e] or 0) + c
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
local function count(counter, units, ttlMs)
	local after = redis.call("INCRBY", counter, units)
	if after == units then
		-- The first requests of a window create its counter: make it expire.
		redis.call("PEXPIRE", counter, ttlMs)
	end
	return after - units
end
local function refund(counter, units)
	if units > 0 then
		redis.call("DECRBY", counter, units)
	end
end

-- (a) Each key's windows.
local at, before = {}, {}
for e, cs in ipairs(counters) do
	for _, k in ipairs(cs) do
		local n = 0
		if added[e] then
			n = count(KEYS[k], added[e], ttl[k])
		end
		before[k], at[k] = n, n
		out[4 + k] = n
	end
end
local passed, units = {}, 0 -- units: of the requests the keys' windows let through
for r = 1, live do
	local e, c = keyOf[r], cost[r]
	local ok = true
	if e > 0 then
		local cs, ls = counters[e], limits[e]
		for j, k in ipairs(cs) do
			if c > ls[j] - at[k] then
				ok = false
			end
		end
		for j, k in ipairs(cs) do
			if ok or at[k] >= ls[j] then
				at[k] = at[k] + c
			end
		end
	end
	passed[r] = ok
	if ok then
		units = units + c
	end
end
for e, cs in ipairs(counters) do
	if added[e] then
		for _, k in ipairs(cs) do
			refund(KEYS[k], added[e] - (at[k] - before[k]))
		end
	end
end

-- (b) The org's minute, for what the keys' windows let through.
if orgLimit > 0 and live > 0 then
	local org
	if units > 0 then
		org = count(orgKey, units, ARGV[1])
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
