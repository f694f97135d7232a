-- Sluice: decides (or refunds) every key of one request, all or nothing.
-- The math is the Go package algorithms, line for line; docs/redis.md says
-- why every number below is exact in Lua's doubles.
--
-- The script is the files lua/NN-*.lua joined in name order (script.go):
-- the protocol's names (00-protocol.lua, generated from protocol.go: the
-- modes, kinds, arguments and replies), then this part (the call's clock
-- and the numbers every part uses), each algorithm, each feature, and the
-- dispatch on the mode (17-main.lua).
--
-- The functions of each algorithm are made only when a call needs them
-- (libM, libB, libW, libC, libL): run by EVALSHA, a script's functions are
-- closures made anew on every call, and making all of them costs more than
-- a whole decision; loaded as a Function, they are made once.

local E9 = 1000000000
local E6 = 1000000
local P52 = 4503599627370496
local P53 = 9007199254740992
-- A stored time more than FAR seconds from now is outside the exact range
-- (2^53 ns is 104 days); every span is at most 52 days, so such a state is
-- idle and reads as a fresh one.
local FAR = 9000000

-- What a call gives, set when it starts (17-main.lua): the script is
-- loaded once as a Redis Function (or run whole by EVALSHA on a server
-- without them), so its functions are made once, and read these.
local KEYS, ARGV, mode, NS, NN, EXTRA
-- Times are nanoseconds relative to the start of the current second, NS.
local now

-- A Function's library is loaded without the standard library: these
-- are set by the call too.
local floor, max, sub

-- floordiv is floor(x/d) for integers 0 <= x <= 2^52, 1 <= d <= 2^52.
local function floordiv(x, d)
	local q = floor(x / d)
	if q * d > x then
		q = q - 1
	elseif (q + 1) * d <= x then
		q = q + 1
	end
	return q
end

-- Most numbers a call reads and writes as decimal strings are few and
-- come again and again (a zone's place and arguments, a cost of 1, a
-- time's second, an expiry in ms), and tonumber (strtod) or string.format
-- costs about 2k instructions, a table's lookup 0.2k: numOf remembers
-- what a string reads as (numOf[s] or num(s) is tonumber(s)), strOf how a
-- number is written (strOf[n] or str(n) is %d). Neither depends on the
-- call, so a Function keeps them from call to call; they start afresh
-- past MEMO_MOST numbers. headOf remembers the same way what the head of
-- a request of MODE_MANY reads as (head, 11-args.lua), and absentScore
-- how often a zone's keys were absent lately (decidePlain, 14-decide.lua).
local MEMO_MOST = 4096
local numOf, strOf, headOf, absentScore, memoN = {}, {}, {}, {}, 0
local function memoRoom()
	memoN = memoN + 1
	if memoN > MEMO_MOST then numOf, strOf, headOf, absentScore, memoN = {}, {}, {}, {}, 1 end
end
local function num(s)
	local v = tonumber(s)
	if v then
		memoRoom()
		numOf[s] = v
	end
	return v
end
local function str(n)
	local v = string.format('%d', n)
	memoRoom()
	strOf[n] = v
	return v
end

-- px is the expiry, in ms, of a state idle at the time idle.
local function px(idle)
	local ms = floordiv(idle - now + E6 - 1, E6) + EXTRA
	if ms < 1 then ms = 1 end
	return ms
end

-- rel reads an absolute time (decimal nanoseconds); nil when it is more
-- than FAR seconds from now.
local function rel(s)
	local n = #s
	local sec, ns = 0, tonumber(s)
	if n > 9 then
		sec = tonumber(sub(s, 1, n - 9))
		ns = tonumber(sub(s, n - 8))
	end
	local d = sec - NS
	if d < -FAR or d > FAR then return nil end
	return d * E9 + ns
end

-- absOf is t as absolute Unix seconds and the nanoseconds within.
local function absOf(t)
	local sec = floor(t / E9)
	local ns = t - sec * E9
	if ns < 0 then
		sec = sec - 1; ns = ns + E9
	elseif ns >= E9 then
		sec = sec + 1; ns = ns - E9
	end
	return NS + sec, ns
end

-- abs writes t as absolute decimal nanoseconds.
local function abs(t)
	local sec, ns = absOf(t)
	if sec == 0 then return string.format('%d', ns) end
	return string.format('%d%09d', sec, ns)
end
