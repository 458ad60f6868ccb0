-- KEYS[1]: the counter of one API key in one window.
-- ARGV[1]: how long the counter must live from now, in milliseconds: the rest of its
--          window and one window more. Relative, so that a gateway clock behind Redis's
--          cannot write a counter that is already expired.
-- ARGV[2], ARGV[3], …: one per request to count, its caller's deadline on Redis's
--          clock, in Unix milliseconds; 0 for none.
-- Returns {count, now} with now Redis's clock in Unix milliseconds and count the
-- counter after this call; count is -1 when every deadline had passed and nothing was
-- counted. A request is counted when its deadline is 0 or not before now.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = 0
for i = 2, #ARGV do
	local deadline = tonumber(ARGV[i])
	if deadline <= 0 or now <= deadline then
		live = live + 1
	end
end
if live == 0 then
	return {-1, now}
end
local n = redis.call("INCRBY", KEYS[1], live)
if n == live then
	-- The first requests of a window create the counter: make it expire on its own.
	redis.call("PEXPIRE", KEYS[1], ARGV[1])
end
return {n, now}
