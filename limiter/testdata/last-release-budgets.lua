-- KEYS[1]: the org's minute counter of the window.
-- KEYS[2]: the org's month counter.
-- KEYS[3], …: the minute counters of the org's keys, each once.
-- ARGV[1]: how long a minute counter must live from now, in milliseconds (as
--          incrScript's ARGV[1]).
-- ARGV[2]: how long the month counter must live from now, in milliseconds: until a
--          day after the month's end.
-- ARGV[3]: what a missing month counter starts from; negative: count nothing, and
--          say so.
-- ARGV[4]: the org's minute limit; 0 for none.
-- ARGV[5]: the month's limit; 0 for none.
-- ARGV[6], …: the limit of each key counter, in the order of KEYS[3], ….
-- Then two per request: the index in KEYS of its key's counter (0: no key budget),
--          and its caller's deadline on Redis's clock in Unix milliseconds (0: none).
-- Returns {status, now, org, month, key…}: status 0, or -2 when the month counter
-- was missing and nothing was counted (then nothing follows now); now Redis's clock
-- in Unix milliseconds; then the org's minute count, the month's count and each key
-- counter's, in the order of KEYS[3], …, as they stood before this call.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local orgLimit, monthLimit = tonumber(ARGV[4]), tonumber(ARGV[5])
local first = 4 + #KEYS -- the first request's first argument

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
local out = {0, now, 0, month}

-- (a) The key's minute counts every live request; the first of a key's that its limit
-- leaves room for pass.
local passed = added[0] or 0
for k = 3, #KEYS do
	local n, before = added[k], 0
	if n then
		local after = redis.call("INCRBY", KEYS[k], n)
		if after == n then
			-- The first requests of a window create its counter: make it expire.
			redis.call("PEXPIRE", KEYS[k], ARGV[1])
		end
		before = after - n
		passed = passed + math.min(n, math.max(tonumber(ARGV[3 + k]) - before, 0))
	end
	out[#out + 1] = before
end

-- (b) The org's minute counts what the key's let through; the first it leaves room for
-- pass.
if orgLimit > 0 and live > 0 then
	local org
	if passed > 0 then
		org = redis.call("INCRBY", KEYS[1], passed)
		if org == passed then
			redis.call("PEXPIRE", KEYS[1], ARGV[1])
		end
		org = org - passed
	else
		org = tonumber(redis.call("GET", KEYS[1]) or "0")
	end
	out[3] = org
	passed = math.min(passed, math.max(orgLimit - org, 0))
end

-- (c) The month counts only what it lets through.
if monthLimit > 0 then
	local n = math.min(passed, math.max(monthLimit - month, 0))
	if n > 0 then
		redis.call("INCRBY", KEYS[2], n)
	end
end
return out
