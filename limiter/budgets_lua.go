package limiter

import "github.com/redis/go-redis/v9"

// budgetScript counts requests of one organisation against their budgets, stage by
// stage (see BudgetLimiter), as one atomic step on the Redis server, so that each
// stage is exact across gateways. Every key it touches carries the org's hash tag,
// so it works on Redis Cluster.
//
// One call may count several requests of the org (a pipelined round gathers them),
// of one or several of its keys: each request meets the counts its predecessors in
// ARGV left. As incrScript does, it counts no request whose deadline has passed.
//
// A missing month counter is the sign of a new month, or of a Redis that lost its
// data. Unless told what the month starts from, the script then counts nothing at
// all, so that the caller can read the month's count from its record and call again
// with it.
var budgetScript = redis.NewScript(`
-- KEYS[1]: the org's minute counter of the window.
-- KEYS[2]: the org's month counter.
-- KEYS[3], …: the minute counters of the org's keys, each once.
-- ARGV[1]: how long a minute counter must live from now, in milliseconds (as
--          incrScript's ARGV[1]).
-- ARGV[2]: how long the month counter must live from now, in milliseconds: until a
--          day after the month's end.
-- ARGV[3]: what a missing month counter starts from; negative: count nothing, and
--          say so.
-- ARGV[4…]: five per request: the index in KEYS of its key's counter (0: no key
--          budget), the key's limit, the org's minute limit (0: none), the month's
--          limit (0: none), and its caller's deadline on Redis's clock in Unix
--          milliseconds (0: none).
-- Returns {status, now, then four per request}: status 0, or -2 when the month
-- counter was missing and nothing was counted; now Redis's clock in Unix
-- milliseconds; per request its stage (0 passed every budget, 1 refused by the key's
-- minute, 2 by the org's, 3 by the month; -1 late, not counted) and the key's, the
-- org's and the month's counts, each after this request if counted there, else as it
-- stood (0 for a budget it does not have).
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = (#ARGV - 3) / 5

local live = {}
local needMonth = false
for i = 1, n do
	local a = 3 + (i - 1) * 5
	local deadline = tonumber(ARGV[a + 5])
	live[i] = deadline <= 0 or now <= deadline
	if live[i] and tonumber(ARGV[a + 4]) > 0 then
		needMonth = true
	end
end

local month = 0
if needMonth then
	local v = redis.call("GET", KEYS[2])
	if v then
		month = tonumber(v)
	else
		local seed = tonumber(ARGV[3])
		if seed < 0 then
			return {-2, now}
		end
		month = seed
		redis.call("SET", KEYS[2], seed, "PX", ARGV[2])
	end
end

-- Counts are read once, kept here, and written once at the end.
local counts, added = {}, {}
local function count(k)
	if counts[k] == nil then
		counts[k] = tonumber(redis.call("GET", KEYS[k]) or "0")
		added[k] = 0
	end
	return counts[k]
end
local function bump(k)
	local c = count(k) + 1
	counts[k], added[k] = c, added[k] + 1
	return c
end

local out = {0, now}
local monthAdded = 0
for i = 1, n do
	local a = 3 + (i - 1) * 5
	local key, keyLimit = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
	local orgLimit, monthLimit = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
	local stage, kc, oc, mc = -1, 0, 0, 0
	if live[i] then
		stage = 0
		-- (a) The key's minute counts every request.
		if key > 0 then
			kc = bump(key)
			if kc > keyLimit then
				stage = 1
			end
		end
		-- (b) The org's minute counts what the key's let through.
		if orgLimit > 0 then
			if stage == 0 then
				oc = bump(1)
				if oc > orgLimit then
					stage = 2
				end
			else
				oc = count(1)
			end
		end
		-- (c) The month counts only what it lets through, which passed (a) and (b).
		if monthLimit > 0 then
			mc = month
			if stage == 0 then
				if month >= monthLimit then
					stage = 3
				else
					month = month + 1
					monthAdded = monthAdded + 1
					mc = month
				end
			end
		end
	end
	out[#out + 1] = stage
	out[#out + 1] = kc
	out[#out + 1] = oc
	out[#out + 1] = mc
end

for k, d in pairs(added) do
	if d > 0 then
		if redis.call("INCRBY", KEYS[k], d) == d then
			-- The first requests of a window create its counter: make it expire.
			redis.call("PEXPIRE", KEYS[k], ARGV[1])
		end
	end
end
if monthAdded > 0 then
	-- The month counter exists (read or seeded above), with its expiry.
	redis.call("INCRBY", KEYS[2], monthAdded)
end
return out
`)
