-- Sluice: decides (or refunds) every key of one request, all or nothing.
-- The math is the Go package algorithms, line for line; docs/redis.md says
-- why every number below is exact in Lua's doubles.
--
-- KEYS[i]   the state of one (zone, scope, key).
-- ARGV[1]   "d" decide, "u" decide for an undo, "r" refund, "x" undo,
--           "m" decide many requests, each on its own (see the end),
--           "k" commit and "e" release reservations (SPEND BUDGETS),
--           "s" settle a real cost (SETTLE, near the end).
-- ARGV[2,3] "" and "" to read the clock with TIME; tests pass seconds and
--           nanoseconds instead so that Redis and the memory store see the
--           same instants.
-- ARGV[4]   milliseconds added to every expiry (0 in production; tests with
--           an injected clock keep keys past their idle time, which is
--           harmless: an idle state decides like a fresh one).
-- Then F arguments per key, from ARGV[5 + (i-1)*F]:
--   kind   b bucket (token bucket, GCRA, leaky meter), q leaky queue,
--          w fixed window, c sliding window counter, l sliding log
--   p1     the rate parameter: interval T (b, q) or window W (w, c, l), ns;
--          a calendar window's adds its boundaries (CALENDAR WINDOWS); an
--          adaptive bucket's or queue's is "T/R", deciding with interval T
--          while its states stay written under the registered R (a.param):
--          a state is a time, which a change of max_events keeps as it is
--   p2     burst (b), max_delay (q) or limit (w, c, l)
--   cost   units, already summed over repeated keys and capped by the caller
--   x1     decide: "1" for a shadow request; refund: the decision's time
--   x2     refund: the decision's delay (q); settle: the real cost;
--          decide: "" or a reservation, commit, release and undo: its
--          token (see SPEND BUDGETS)
--   lin    the lineage of the zone's policy history in the calling process
--   gen    the generation of the calling process's current policy
--   hist   the policy changes "at,gen,param;..." oldest first (may be "")
--   from   "" or, for a zone whose kind of state changed, "pos|kind,p1,p2,
--          at,until;...": the kinds it may carry usage from, newest first,
--          when the change was and until when their keys may live, and pos
--          the place of the kind letter in the key
--   lk     "" or, for a limit with lockout, "pos|step,step,...": the
--          lock-out steps in ns and the place of the kind letter in the
--          key (see LOCK-OUTS)
--
-- Reply (decide): now seconds, now nanoseconds, 1 if the request may
-- proceed, then per key: allowed, limit, remaining, retry_after,
-- reset_after, delay, and the time the event was logged at minus now (the
-- sliding log; 0 for the others). Mode "u" adds per key the value before,
-- its expiry in ms (PTTL) and the value written ("" when none). Refund and
-- undo reply {}.

local F = 11
local E9 = 1000000000
local E6 = 1000000
local P52 = 4503599627370496
local P53 = 9007199254740992
-- A stored time more than FAR seconds from now is outside the exact range
-- (2^53 ns is 104 days); every span is at most 52 days, so such a state is
-- idle and reads as a fresh one.
local FAR = 9000000

local mode = ARGV[1]
local NS, NN
if ARGV[2] ~= '' then
	NS = tonumber(ARGV[2])
	NN = tonumber(ARGV[3])
else
	local t = redis.call('TIME')
	NS = tonumber(t[1])
	NN = tonumber(t[2]) * 1000
end
local EXTRA = tonumber(ARGV[4])
-- Times are nanoseconds relative to the start of the current second, NS.
local now = NN

local floor = math.floor
local max = math.max
local sub = string.sub

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

-- px is the expiry, in ms, of a state idle at the time idle.
local function px(idle)
	local ms = floordiv(idle - now + E6 - 1, E6) + EXTRA
	if ms < 1 then ms = 1 end
	return ms
end

