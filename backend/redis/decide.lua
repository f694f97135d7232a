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

-- muldiv is floor(a*b/c) and the remainder, exactly, for integers
-- 0 <= a, b < 2^53 and 1 <= c <= 2^52, by binary long multiplication with
-- the running quotient and remainder (r < c keeps 2r and r + b mod c below
-- 2^53). A quotient above most (default 2^52, below 2^53) saturates to P53
-- (remainder -1).
-- The functions of each algorithm are made only when a call needs them:
-- a script's functions are closures made anew on every call, and making
-- all of them costs more than a whole decision.

local Mlib
local function libM()
	if Mlib then return Mlib end
	local function muldiv(a, b, c, most)
		most = most or P52
		local p = a * b
		if p < P52 then
			local q = floordiv(p, c)
			return q, p - q * c
		end
		if a > b then a, b = b, a end
		local bq = floordiv(b, c)
		local br = b - bq * c
		local bit = 1
		while bit * 2 <= a do bit = bit * 2 end
		local q, r = 0, 0
		while bit >= 1 do
			q = q * 2
			r = r * 2
			if r >= c then r = r - c; q = q + 1 end
			if a >= bit then
				a = a - bit
				q = q + bq
				r = r + br
				if r >= c then r = r - c; q = q + 1 end
			end
			if q > most then return P53, -1 end
			bit = bit / 2
		end
		return q, r
	end

	local function muldivceil(a, b, c, most)
		local q, r = muldiv(a, b, c, most)
		if r > 0 then q = q + 1 end
		return q
	end

	-- mulmod is a*b mod c for 0 <= a < 2^53, 0 <= b, c <= 2^52, c >= 1.
	local function mulmod(a, b, c)
		local p = a * b
		if p < P52 then return p - floordiv(p, c) * c end
		local br = b - floordiv(b, c) * c
		local bit = 1
		while bit * 2 <= a do bit = bit * 2 end
		local r = 0
		while bit >= 1 do
			r = r * 2
			if r >= c then r = r - c end
			if a >= bit then
				a = a - bit
				r = r + br
				if r >= c then r = r - c end
			end
			bit = bit / 2
		end
		return r
	end

	-- absmod is (the absolute time of t) mod w: epoch-aligned windows.
	local basemod = {}
	local function absmod(t, w)
		local b = basemod[w]
		if not b then
			-- Whole seconds and divisors of a second need no long
			-- multiplication: (NS·10^9) mod (k·10^9) = (NS mod k)·10^9.
			if w % E9 == 0 then
				b = (NS % (w / E9)) * E9
			elseif E9 % w == 0 then
				b = 0
			else
				b = mulmod(NS, E9, w)
			end
			basemod[w] = b
		end
		local x = b + t
		local m = x - floor(x / w) * w
		if m < 0 then m = m + w elseif m >= w then m = m - w end
		return m
	end

	-- rel reads an absolute time (decimal nanoseconds); nil when it is more
	Mlib = {muldiv = muldiv, muldivceil = muldivceil, absmod = absmod}
	return Mlib
end

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

-- abs writes t as absolute decimal nanoseconds.
local function abs(t)
	local sec = floor(t / E9)
	local ns = t - sec * E9
	if ns < 0 then
		sec = sec - 1; ns = ns + E9
	elseif ns >= E9 then
		sec = sec + 1; ns = ns - E9
	end
	sec = NS + sec
	if sec == 0 then return string.format('%d', ns) end
	return string.format('%d%09d', sec, ns)
end

-- counted is the part the window algorithms share (algorithms.counted).
-- Result: {allowed, limit, remaining, retry, reset, delay}; done.
local function counted(limit, used, cost, reset)
	local r = {0, limit, limit - used, 0, reset, 0}
	if r[3] < 0 then r[3] = 0 end
	if cost == 0 then
		r[1] = 1
		return r, true
	elseif cost > limit then
		r[4] = -1
		return r, true
	elseif used + cost <= limit then
		r[1] = 1
		r[3] = limit - used - cost
		return r, true
	end
	return r, false
end

------------------------------------------------------------------------
-- Bucket: {tat} (tat nil: a full bucket).

local Blib
local function libB()
	if Blib then return Blib end
	local function debt(s, t)
		if s.tat and s.tat > t then return s.tat - t end
		return 0
	end

	local function tokens(cap, T, d)
		if d >= cap then return 0 end
		return floordiv(cap - d, T)
	end

	local function bucketDecide(s, T, burst, cost)
		local cap = burst * T
		local d = debt(s, now)
		if cost > burst then return {0, burst, tokens(cap, T, d), -1, d, 0} end
		local nd = d + cost * T
		if nd <= cap or cost == 0 then return {1, burst, tokens(cap, T, nd), 0, nd, 0} end
		return {0, burst, tokens(cap, T, d), nd - cap, d, 0}
	end

	local function queued(maxDelay, T, d)
		if d > maxDelay then return 0 end
		return floordiv(maxDelay - d, T) + 1
	end

	local function queueDecide(s, T, maxDelay, cost)
		local size = floordiv(maxDelay, T) + 1
		local d = debt(s, now)
		if cost == 0 then return {1, size, queued(maxDelay, T, d), 0, d, 0} end
		if cost > size then return {0, size, queued(maxDelay, T, d), -1, d, 0} end
		if d <= maxDelay then
			local reset = d + cost * T
			return {1, size, queued(maxDelay, T, reset), 0, reset, d}
		end
		return {0, size, 0, d - maxDelay, d, 0}
	end

	local function bucketTake(s, T, cost)
		return {tat = now + debt(s, now) + cost * T}
	end

	-- till: when the decision said the bucket would be full again; the
	-- refill has paid the charge off by then (algorithms' bucket.Refund).
	local function bucketRefund(s, T, cost, till)
		local back = cost * T
		if till and back > till - now then back = till - now end
		if back <= 0 then return s end
		local d = debt(s, now) - back
		if d <= 0 then return {} end
		return {tat = now + d}
	end

	local function queueRefund(s, T, cost, at, delay)
		local slot = at + delay
		if cost <= 0 or s.tat ~= slot + cost * T or slot < now then return s end
		return {tat = slot}
	end

	-- bucketRebase keeps the debt at the new interval, up to most (as
	-- algorithms.LeakyBucket.Rebase and bucket.Rebase bound it).
	local function bucketRebase(s, at, old, new, most)
		if not s.tat or s.tat <= at or old == new then return s end
		local d = libM().muldivceil(s.tat - at, new, old, most)
		if d > most then d = most end
		return {tat = at + d}
	end

	Blib = {decide = bucketDecide, qdecide = queueDecide, take = bucketTake, refund = bucketRefund, qrefund = queueRefund, rebase = bucketRebase}
	return Blib
end

------------------------------------------------------------------------
-- CALENDAR WINDOWS (backend/redis/budget.go). A fixed window aligned to
-- the hours, days or months of a time zone comes with p1 written
-- "<W>@<b0>,<b1>,<b2>,<b3>": the boundaries of three consecutive windows
-- around the calling instance's clock, computed by Go (Lua has no time
-- zone rules). The script picks the one that holds its own TIME, so the
-- instances agree as long as their clocks are within a window of Redis's.

-- calArg reads such a p1 into a.p1 (W, the nominal length that the
-- policy history records) and a.cal (the boundaries, relative to now).
local function calArg(a, raw)
	local w, b0, b1, b2, b3 = string.match(raw, '^(%d+)@(%d+),(%d+),(%d+),(%d+)$')
	if not w then error('bad window argument ' .. raw) end
	a.p1 = tonumber(w)
	a.cal = {rel(b0), rel(b1), rel(b2), rel(b3)}
end

-- calStart is the start of the window that holds t.
local function calStart(cal, t)
	for i = 1, 3 do
		if cal[i] and cal[i + 1] and cal[i] <= t and t < cal[i + 1] then return cal[i] end
	end
	error('calendar window: the clock of Redis and of the Caddy that called differ by more than a window')
end

-- calEnd is the end of the window that starts at start (W after it for a
-- start Go did not send: a window long over, whose end matters little).
local function calEnd(cal, start, W)
	for i = 1, 3 do
		if cal[i] == start then return cal[i + 1] end
	end
	return start + W
end
-- END CALENDAR WINDOWS

------------------------------------------------------------------------
-- Fixed window: {start, count} (start nil: a fresh key).

local Wlib
local function libW()
	if Wlib then return Wlib end
	local absmod = libM().absmod
	local function windowCurrent(s, W, t, cal)
		local start
		if cal then start = calStart(cal, t) else start = t - absmod(t, W) end
		if s.start and start <= s.start then return s.start, s.count end
		return start, 0
	end

	local function windowDecide(s, W, limit, cost, cal)
		local start, count = windowCurrent(s, W, now, cal)
		local stop = start + W - now
		if cal then stop = calEnd(cal, start, W) - now end
		local reset = stop
		if count == 0 and cost == 0 then reset = 0 end
		local r, done = counted(limit, count, cost, reset)
		if not done then r[4] = stop end
		return r
	end

	local function windowTake(s, W, cost, cal)
		local start, count = windowCurrent(s, W, now, cal)
		return {start = start, count = count + cost}
	end

	local function windowRefund(s, W, cost, at, cal)
		local start, count = windowCurrent(s, W, now, cal)
		if start ~= s.start or at < start then return s end
		count = count - cost
		if count < 0 then count = 0 end
		return {start = start, count = count}
	end

	local function windowRebase(s, at, old, new)
		if old == new or not s.start or s.count == 0 then return s end
		if s.start + old <= at then return {} end
		return {start = at - absmod(at, new), count = s.count}
	end

	Wlib = {decide = windowDecide, take = windowTake, refund = windowRefund, rebase = windowRebase}
	return Wlib
end

------------------------------------------------------------------------
-- Sliding window counter: {start, prev, curr} (start nil: a fresh key).

local Clib
local function libC()
	if Clib then return Clib end
	local m = libM()
	local muldiv, muldivceil, absmod = m.muldiv, m.muldivceil, m.absmod
	local function roll(s, W, t)
		local start = t - absmod(t, W)
		if s.start and start <= s.start then
			local e = t - s.start
			if e < 0 then e = 0 end
			return {start = s.start, prev = s.prev, curr = s.curr}, e
		elseif s.start and start == s.start + W then
			return {start = start, prev = s.curr, curr = 0}, t - start
		end
		return {start = start, prev = 0, curr = 0}, t - start
	end

	local function weighted(W, prev, e)
		if prev == 0 then return 0 end
		return (muldiv(prev, W - e, W))
	end

	local function counterReset(c, W)
		if c.curr > 0 then return c.start + 2 * W - now end
		if c.prev > 0 then return c.start + W - now end
		return 0
	end

	local function firstFit(W, prev, k)
		if prev == 0 then return 0 end
		local m = muldivceil(k + 1, W, prev) - 1
		if W - m > 0 then return W - m end
		return 0
	end

	local function counterDecide(s, W, limit, cost)
		local c, e = roll(s, W, now)
		local est = weighted(W, c.prev, e) + c.curr
		local r, done = counted(limit, est, cost, counterReset(c, W))
		if not done then
			local retry
			local k = limit - c.curr - cost
			if k >= 0 then
				local f = firstFit(W, c.prev, k)
				if f < W then
					retry = f - e
					if retry < 1 then retry = 1 end
				end
			end
			if not retry then
				retry = c.start + W + firstFit(W, c.curr, limit - cost) - now
			end
			r[4] = retry
		elseif r[1] == 1 and cost > 0 then
			r[5] = c.start + 2 * W - now
		end
		return r
	end

	local function counterTake(s, W, cost)
		local c = roll(s, W, now)
		c.curr = c.curr + cost
		return c
	end

	local function counterRefund(s, W, cost, at)
		local c = roll(s, W, now)
		if at >= c.start then
			c.curr = c.curr - cost
			if c.curr < 0 then c.curr = 0 end
		elseif at >= c.start - W then
			c.prev = c.prev - cost
			if c.prev < 0 then c.prev = 0 end
		end
		return c
	end

	local function counterRebase(s, at, old, new)
		if old == new or not s.start then return s end
		local c, e = roll(s, old, at)
		local est = weighted(old, c.prev, e) + c.curr
		if est == 0 then return {} end
		return {start = at - absmod(at, new), prev = 0, curr = est}
	end

	Clib = {decide = counterDecide, take = counterTake, refund = counterRefund, rebase = counterRebase}
	return Clib
end

------------------------------------------------------------------------
-- Sliding log: one string. A header ('<ddBBI4I4', 26 bytes): the base
-- second, the units the live events hold, the format, a byte older
-- versions set when some events were given back, the number of events
-- pruned (they stay in the string until it is compacted) and the number of
-- events. Then the events, oldest first, each with its time in ns after the
-- base second (double).
--   Format 0, every event one unit: the time alone (8 bytes). A denied
--   request's retry time is the time of the need-th live event: one read.
--   Format 2, units that vary or an event given back: the time (an event
--   given back is marked by writing -time-1), its units (uint32) and the
--   node of a Fenwick tree over the units of events 1..n (double: the units
--   of events i-lowbit(i)+1..i, given-back ones counting 0). The event at
--   which enough units leave the window is found by descending the tree,
--   and an event is given back by updating the nodes above it: O(log n)
--   reads and writes however the costs were chosen, where walking the
--   events one by one let a client who chooses costs (many tiny events,
--   then a large one) make every denied call read the whole log.
--   Format 1 (units per event, found by walking) is only read, from logs
--   older versions wrote: they are rewritten in format 2 when loaded.
-- A decision reads the header and the few events it needs (GETRANGE), logs
-- an event by writing past the last one and rewrites the header in place
-- (SETRANGE): the whole string is rewritten only when its pruned part
-- outgrows the live part (amortized O(1) per event logged).

local Llib
local function libL()
	if Llib then return Llib end
	local HDR = 26
	local CH = 32 -- events per read
	local STRIDE = {[0] = 8, [1] = 12, [2] = 20}
	local FENMAX = 140737488355328 -- 2^47

	local function lowbit(i)
		local b = 1
		while i % (b + b) == 0 do b = b + b end
		return b
	end

	-- logEvent returns event i's time and units (0: given back).
	local function logEvent(l, i)
		local c = floor((i - 1) / CH)
		local s = l.chunks[c]
		if not s then
			local from = HDR + c * CH * l.stride
			s = redis.call('GETRANGE', l.key, from, from + CH * l.stride - 1)
			l.chunks[c] = s
		end
		local pos = (i - 1 - c * CH) * l.stride + 1
		local off = struct.unpack('<d', s, pos)
		local u = 1
		if l.wide ~= 0 then u = struct.unpack('<I4', s, pos + 8) end
		if off < 0 then return l.base - off - 1, 0 end
		return l.base + off, u
	end

	-- logFen reads node i of a format-2 log's tree, through the chunks
	-- already read, or on its own (a descent touches one node per chunk).
	local function logFen(l, i)
		local v = l.fens[i]
		if v then return v end
		local c = floor((i - 1) / CH)
		local s = l.chunks[c]
		if s then
			v = struct.unpack('<d', s, (i - 1 - c * CH) * 20 + 13)
		else
			local from = HDR + (i - 1) * 20 + 12
			v = struct.unpack('<d', redis.call('GETRANGE', l.key, from, from + 7))
		end
		l.fens[i] = v
		return v
	end

	-- logFenSub takes units out of event i in the tree: the nodes above it.
	local function logFenSub(l, key, i, units)
		while i <= l.n do
			local f = logFen(l, i) - units
			l.fens[i] = f
			redis.call('SETRANGE', key, HDR + (i - 1) * 20 + 12, struct.pack('<d', f))
			i = i + lowbit(i)
		end
	end

	-- logPrefix is the units of events 1..i, given-back ones counting 0.
	local function logPrefix(l, i)
		local s = 0
		while i > 0 do
			s = s + logFen(l, i)
			i = i - lowbit(i)
		end
		return s
	end

	-- logSearch is the first event i (of 1..n) with logPrefix(i) >= target;
	-- the nodes are never negative, so the tree can be descended.
	local function logSearch(l, target)
		local pos, step = 0, 1
		while step * 2 <= l.n do step = step * 2 end
		while step >= 1 do
			local j = pos + step
			if j <= l.n then
				local f = logFen(l, j)
				if f < target then
					pos = j
					target = target - f
				end
			end
			step = step / 2
		end
		return pos + 1
	end

	local function logHeader(l)
		return struct.pack('<ddBBI4I4', NS + l.base / E9, l.sum, l.wide, 0, l.h, l.n)
	end

	-- logRewrite writes the live events of l, and the event (t, u) when t
	-- is given, as a new string in format fmt whose base is the second of
	-- its oldest event, and returns it loaded; nil (the key deleted) when
	-- no event is left.
	local function logRewrite(l, fmt, t, u)
		local times, units = {}, {}
		local sum = 0
		local base
		if l.n then
			for i = l.h + 1, l.n do
				local at, k = logEvent(l, i)
				if k > 0 then
					if not base then base = floor(at / E9) * E9 end
					times[#times + 1] = at
					units[#units + 1] = k
					sum = sum + k
				end
			end
		end
		if t then
			if not base then base = floor(t / E9) * E9 end
			times[#times + 1] = t
			units[#units + 1] = u
			sum = sum + u
		end
		local m = #times
		if m == 0 then
			redis.call('DEL', l.key)
			return nil
		end
		local parts = {}
		if fmt == 2 then
			local fen = {}
			for i = 1, m do fen[i] = units[i] end
			for i = 1, m do
				local j = i + lowbit(i)
				if j <= m then fen[j] = fen[j] + fen[i] end
			end
			for i = 1, m do parts[i] = struct.pack('<dI4d', times[i] - base, units[i], fen[i]) end
		else
			for i = 1, m do parts[i] = struct.pack('<d', times[i] - base) end
		end
		local nl = {key = l.key, base = base, sum = sum, wide = fmt, h = 0, h0 = 0, n = m,
			stride = STRIDE[fmt], chunks = {}, fens = {}}
		redis.call('SET', l.key, logHeader(nl) .. table.concat(parts))
		return nl
	end

	-- logLoad reads key's header: nil when there is no log (or only one
	-- so old that every event has left every window).
	local function logLoad(key)
		local hdr = redis.call('GETRANGE', key, 0, HDR - 1)
		if #hdr < HDR then
			if sub(hdr, 1, 1) == 'm' then return nil, redis.call('GET', key) end
			return nil
		end
		local base, sum, wide, tombs, head, n = struct.unpack('<ddBBI4I4', hdr)
		local d = base - NS
		if d < -FAR or d > FAR then return nil end
		local l = {key = key, base = d * E9, sum = sum, wide = wide,
			h = head, h0 = head, n = n, stride = STRIDE[wide], chunks = {}, fens = {}}
		if wide == 1 or (wide == 0 and tombs == 1) then
			-- An older version's log, whose retry time was found by walking.
			return logRewrite(l, 2)
		end
		return l
	end

	-- logNewest is the time of the newest event not given back, or nil
	-- (a format-2 log keeps its last event live: O(1)).
	local function logNewest(l)
		for i = l.n, l.h + 1, -1 do
			local t, u = logEvent(l, i)
			if u > 0 then return t end
		end
		return nil
	end

	-- logPrune drops (logically) the events with at + W <= now, and the
	-- events given back at the head. Each event is pruned once: amortized
	-- O(1) per event logged.
	local function logPrune(l, W)
		while l.h < l.n do
			local t, u = logEvent(l, l.h + 1)
			if u > 0 and t + W > now then break end
			l.sum = l.sum - u
			l.h = l.h + 1
		end
	end

	local function logDecide(l, W, limit, cost)
		local count = 0
		local reset = 0
		if l.n then
			logPrune(l, W)
			count = l.sum
			local t = logNewest(l)
			if t and t + W > now then reset = t + W - now end
		end
		local r, done = counted(limit, count, cost, reset)
		if done then
			if r[1] == 1 and cost > 0 and r[5] < W then r[5] = W end
			return r
		end
		-- Wait until enough of the oldest units leave: need <= count, as a
		-- cost above the limit is done above.
		local need = count + cost - limit
		local i = l.h + need
		if l.wide == 2 then i = logSearch(l, logPrefix(l, l.h) + need) end
		r[4] = logEvent(l, i) + W - now
		return r
	end

	-- logTake logs cost units at now (at the newest event's time if the
	-- clock stepped back) and returns that time.
	local function logTake(l, W, cost, key)
		local t = now
		if not l.n then
			l = {key = key}
		else
			logPrune(l, W)
			local newest = logNewest(l)
			if newest and newest > t then t = newest end
		end
		local fmt = l.wide or 0
		if cost ~= 1 then fmt = 2 end
		local live = (l.n or 0) - (l.h or 0)
		local fits = l.n and fmt == l.wide and t - l.base < P52
		local small = fits and fmt == 0 and live * 8 <= 4096
		local rec
		if small then
			-- A log of up to 4 KB is copied whole, without its pruned events: a
			-- string appended to grows its allocation ahead of use.
			local tail = redis.call('GETRANGE', key, HDR + l.h * 8, -1)
			l.sum = l.sum + cost
			l.n = live + 1
			l.h = 0
			redis.call('SET', key, logHeader(l) .. tail .. struct.pack('<d', t - l.base))
		elseif fits and l.h <= live and fmt == 0 then
			rec = struct.pack('<d', t - l.base)
		elseif fits and l.h <= live then
			-- Node i holds event i and the nodes below it that it covers.
			local i = l.n + 1
			local f = cost
			local j, stop = i - 1, i - lowbit(i)
			while j > stop do
				f = f + logFen(l, j)
				j = j - lowbit(j)
			end
			-- Nodes of at most 2^47 keep every prefix sum (at most 32
			-- nodes) exact; a rewrite makes the nodes cover the live
			-- events alone, at most the limit (below 2^32).
			if f <= FENMAX then rec = struct.pack('<dI4d', t - l.base, cost, f) end
		end
		if rec then
			-- Written at its place, not appended: a format-2 string may
			-- hold given-back events past the last one.
			redis.call('SETRANGE', key, HDR + l.n * l.stride, rec)
			l.sum = l.sum + cost
			l.n = l.n + 1
			redis.call('SETRANGE', key, 0, logHeader(l))
		elseif not small then
			logRewrite(l, fmt, t, cost)
		end
		redis.call('PEXPIRE', key, px(t + W))
		return t
	end

	-- logKeep writes back what a decision pruned without taking: the memory
	-- store's log drops those events, and a later, longer window must not
	-- see them again.
	local function logKeep(l, key)
		if not l.n or l.h == l.h0 then return end
		if not logNewest(l) then
			redis.call('DEL', key)
			return
		end
		redis.call('SETRANGE', key, 0, logHeader(l))
	end

	-- logFind is the newest live event of cost units logged at time at
	-- (refunds and settles). Times never decrease along a format-2 log (an
	-- event is logged at or after the last one, which is live), so it is
	-- found by bisection.
	local function logFind(l, cost, at)
		local lo, hi = l.h + 1, l.n
		if lo > hi or logEvent(l, lo) > at then return nil end
		while lo < hi do
			local mid = floor((lo + hi + 1) / 2)
			if logEvent(l, mid) <= at then lo = mid else hi = mid - 1 end
		end
		for i = lo, l.h + 1, -1 do
			local t, u = logEvent(l, i)
			if t < at then return nil end
			if u == cost then return i end
		end
		return nil
	end

	-- logRefund gives back the event the granted decision logged: cost
	-- units at time at, the newest such event; events of other requests
	-- are never touched.
	local function logRefund(l, cost, at, key, W)
		if not l.n or cost <= 0 then return end
		-- Events that left the window go first, as in a decision, and
		-- stay gone (logKeep) even when the event is not found.
		logPrune(l, W)
		if l.wide ~= 2 then
			l = logRewrite(l, 2)
			if not l then return end
		end
		local i = logFind(l, cost, at)
		if not i then
			logKeep(l, key)
			return
		end
		local t = logEvent(l, i)
		l.sum = l.sum - cost
		if i == l.n then
			-- The last event goes, and the given-back ones before it:
			-- the last event stays live.
			l.n = i - 1
			while l.n > l.h and select(2, logEvent(l, l.n)) == 0 do l.n = l.n - 1 end
		else
			redis.call('SETRANGE', key, HDR + (i - 1) * 20, struct.pack('<d', -(t - l.base) - 1))
			logFenSub(l, key, i, cost)
		end
		l.chunks = {}
		if l.n == l.h then
			redis.call('DEL', key)
			return
		end
		redis.call('SETRANGE', key, 0, logHeader(l))
		redis.call('PEXPIRE', key, px(logNewest(l) + W))
	end
	-- logGrant gives back the newest live units (an operator's grant,
	-- algorithms.SlidingLog.Grant): events given back whole are cut off
	-- the end, and an event holding more units than are left to give
	-- keeps the rest. Giving back every live unit deletes the log.
	local function logGrant(l, units, key, W)
		if not l.n then return end
		logPrune(l, W)
		if units >= l.sum then
			redis.call('DEL', key)
			return
		end
		if l.wide == 0 then
			-- Events of one unit: the newest units events go.
			l.n = l.n - units
			l.sum = l.sum - units
			redis.call('SET', key, logHeader(l) .. redis.call('GETRANGE', key, HDR, HDR + l.n * 8 - 1))
		else
			while units > 0 do
				local t, u = logEvent(l, l.n)
				if u > units then
					local pos = HDR + (l.n - 1) * 20
					redis.call('SETRANGE', key, pos + 8, struct.pack('<I4', u - units))
					logFenSub(l, key, l.n, units)
					l.sum = l.sum - units
					units = 0
				else
					-- The last event is live (given-back ones are cut off
					-- with it): cut it and those before it.
					l.sum = l.sum - u
					units = units - u
					l.n = l.n - 1
					while l.n > l.h and select(2, logEvent(l, l.n)) == 0 do l.n = l.n - 1 end
				end
			end
			redis.call('SETRANGE', key, 0, logHeader(l))
		end
		l.chunks = {}
		redis.call('PEXPIRE', key, px(logNewest(l) + W))
	end

	-- SETTLE (sliding log): algorithms.SlidingLog.Settle, for settle.go.
	-- logSettle rewrites the units of the event a granted decision logged
	-- (est units at time at) to act, giving it back at 0; when the event
	-- has left the window, the extra is logged now. The log holds at most
	-- 2^32 - 1 units.
	local function logSettle(l, est, act, at, key, W)
		if act == est then return end
		local room = 4294967295
		if l.n then
			-- Pruned for good, as the memory store's log is.
			logPrune(l, W)
			logKeep(l, key)
			l.h0 = l.h
			if not logNewest(l) then l = {} end
		end
		if l.n then room = max(room - l.sum, 0) end
		if act == 0 then
			logRefund(l, est, at, key, W)
			return
		end
		local i
		if l.n and est > 0 then
			if l.wide ~= 2 then l = logRewrite(l, 2) or {} end
			if l.n then i = logFind(l, est, at) end
		end
		if not i then
			local extra = act - est
			if extra > room then extra = room end
			if extra > 0 then logTake(l, W, extra, key) end
			return
		end
		local u = act
		if u > est + room then u = est + room end
		if u == est then return end
		redis.call('SETRANGE', key, HDR + (i - 1) * 20 + 8, struct.pack('<I4', u))
		logFenSub(l, key, i, est - u)
		l.sum = l.sum + u - est
		redis.call('SETRANGE', key, 0, logHeader(l))
		l.chunks = {}
		-- Nodes past 2^47 would make prefix sums inexact: a rewrite makes
		-- them cover the live events alone.
		local j = i
		while j <= l.n do
			if l.fens[j] > FENMAX then
				l = logRewrite(l, 2)
				redis.call('PEXPIRE', key, px(logNewest(l) + W))
				return
			end
			j = j + lowbit(j)
		end
	end
	-- END SETTLE (sliding log)

	Llib = {load = logLoad, decide = logDecide, take = logTake, keep = logKeep, refund = logRefund, grant = logGrant, rewrite = logRewrite}
	Llib.settle = logSettle -- SETTLE
	return Llib
end

------------------------------------------------------------------------
-- Loading, rebasing and storing the O(1) states.

-- parse reads a stored value: the state, the rate parameter it was written
-- under, and its lineage and generation.
-- (One match, no table of fields: this runs for every key of every call.)
local function parse(kind, raw)
	local f1, f2, f3, f4, f5, f6 = string.match(raw, '^([^:]*):?([^:]*):?([^:]*):?([^:]*):?([^:]*):?([^:]*)')
	local t = rel(f1)
	if not t then return nil end
	if kind == 'b' or kind == 'q' then
		return {tat = t}, tonumber(f2), f3 ~= '' and f3 or nil, tonumber(f4) or 0
	elseif kind == 'w' then
		return {start = t, count = tonumber(f2)}, tonumber(f3), f4 ~= '' and f4 or nil, tonumber(f5) or 0
	end
	return {start = t, prev = tonumber(f2), curr = tonumber(f3)}, tonumber(f4), f5 ~= '' and f5 or nil, tonumber(f6) or 0
end

local hists = {}
local function history(h)
	local v = hists[h]
	if v then return v end
	v = {}
	for at, gen, param, most in string.gmatch(h, '(%d+),(%d+),(%d+),(%d+)') do
		v[#v + 1] = {at = rel(at), gen = tonumber(gen), param = tonumber(param), most = tonumber(most)}
	end
	hists[h] = v
	return v
end

-- most bounds a bucket's debt (change.most in zones.go).
local function rebase(kind, s, at, old, new, most)
	if kind == 'b' or kind == 'q' then return libB().rebase(s, at, old, new, most) end
	if kind == 'w' then return libW().rebase(s, at, old, new) end
	return libC().rebase(s, at, old, new)
end

-- load returns the key's state, rebased through the policy changes it has
-- not seen, as the memory store's table does: each change at its own time,
-- in order. A state written by a process with another history (another
-- instance of the fleet, or before a restart) is rebased from its own rate
-- to the current one now.
local function load(kind, key, param, p2, lin, gen, hist)
	if kind == 'l' then
		local l, moved = libL().load(key)
		return l or {}, l ~= nil, moved
	end
	local raw = redis.call('GET', key)
	if not raw then return {}, false end
	if sub(raw, 1, 1) == 'm' then return {}, false, raw end
	local s, kp, kl, kg = parse(kind, raw)
	if not s then return {}, true end
	if kl == nil or kl == lin then
		if hist ~= '' and kg < gen then
			for _, sw in ipairs(history(hist)) do
				if sw.gen > kg then
					if not sw.at then
						s = {}
					else
						s = rebase(kind, s, sw.at, kp, sw.param, sw.most)
					end
					kp = sw.param
				end
			end
		end
	end
	if kp ~= param then
		-- The current policy's bound: a queue's slots given out reach
		-- max_delay (p2) + the queue's size in intervals, past 2^52 for a
		-- 30-day window.
		local most = P52
		if kind == 'q' then most = max(P52, p2 + (floordiv(p2, param) + 1) * param) end
		s = rebase(kind, s, now, kp, param, most)
	end
	return s, true
end

-- metaOf is the suffix of a stored value: the rate parameter and, after a
-- policy change, the lineage and generation. Numbers are written with %d:
-- Lua's own conversion keeps only 14 significant digits. The suffix is the
-- same for every key of a zone: it is made once per call.
local metas = {}
local function metaOf(param, lin, gen)
	local byLin = metas[param]
	if not byLin then
		byLin = {}
		metas[param] = byLin
	end
	local byGen = byLin[lin]
	if not byGen then
		byGen = {}
		byLin[lin] = byGen
	end
	local m = byGen[gen]
	if not m then
		m = string.format(':%d', param)
		if gen > 0 then m = m .. string.format(':%s:%d', lin, gen) end
		byGen[gen] = m
	end
	return m
end

-- store writes s with its expiry, or deletes the key when s is the zero
-- state.
local function store(kind, key, s, param, lin, gen, p1, cal)
	local v, idle
	local meta = metaOf(param, lin, gen)
	if kind == 'b' or kind == 'q' then
		if s.tat then
			idle = s.tat
			v = abs(s.tat) .. meta
		end
	elseif kind == 'w' then
		-- A window emptied by refunds is kept to its end: after a change
		-- of window length its start may lie off the new grid, and the
		-- algorithm keeps such a start (it ends the window).
		if s.start then
			idle = s.start + p1
			if cal then idle = calEnd(cal, s.start, p1) end
			v = abs(s.start) .. string.format(':%d', s.count) .. meta
		end
	elseif s.start then
		if s.curr > 0 then
			idle = s.start + 2 * p1
		else
			idle = s.start + p1
		end
		v = abs(s.start) .. string.format(':%d:%d', s.prev, s.curr) .. meta
	end
	-- A state that is idle just now is still kept for a millisecond: a
	-- clock that steps back would see it in use again.
	if not idle then
		redis.call('DEL', key)
		return
	end
	redis.call('SET', key, v, 'PX', px(idle))
end

------------------------------------------------------------------------
-- A change of kind of state (algorithms/usage.go, line for line). The
-- first decision of a key under the new kind reads the key of the kind it
-- replaced (same hash tag, same slot), writes the new kind's state from
-- its usage, and leaves a forwarding mark in the old key ("m" then the new
-- kind, its p1, p2 and the place of the kind letter), under the old key's
-- expiry: a request of a config still on the old kind decides by the new
-- state, and a zone that comes back to the old kind reads the mark as
-- absent and translates again.

local function keyOf(key, pos, kind)
	if kind == 'q' then kind = 'b' end
	return sub(key, 1, pos - 1) .. kind .. sub(key, pos + 1)
end

local froms = {}
local function fromList(spec)
	local v = froms[spec]
	if v then return v end
	local pos, rest = string.match(spec, '^(%d+)|(.*)$')
	v = {pos = tonumber(pos), has = {}}
	for k, p1, p2, at, untl in string.gmatch(rest, '(%a),(%d+),(%d+),(%d+),(%d+)') do
		v[#v + 1] = {kind = k, p1 = tonumber(p1), p2 = tonumber(p2), at = at, untl = untl}
		v.has[keyOf('b', 1, k)] = true
	end
	froms[spec] = v
	return v
end

local function decideBy(kind, s, p1, p2, cost)
	if kind == 'b' then return libB().decide(s, p1, p2, cost) end
	if kind == 'q' then return libB().qdecide(s, p1, p2, cost) end
	if kind == 'w' then return libW().decide(s, p1, p2, cost) end
	if kind == 'c' then return libC().decide(s, p1, p2, cost) end
	return libL().decide(s, p1, p2, cost)
end

-- usage is Algorithm.Usage: a decision of no units gives the limit, the
-- room and the reset; one of a unit, when there is no room, the wait.
local function usage(kind, s, p1, p2)
	local r = decideBy(kind, s, p1, p2, 0)
	local u = {limit = r[2], remaining = r[3], retry = 0, reset = r[5]}
	if u.remaining == 0 then
		local d = decideBy(kind, s, p1, p2, 1)
		if d[1] == 0 then u.retry = d[4] end
	end
	return u
end

local function share(u, limit)
	if u.limit <= 0 or u.remaining <= 0 then return 0 end
	if u.remaining >= u.limit then return limit end
	local q = libM().muldiv(u.remaining, limit, u.limit)
	if q > limit then q = limit end
	return q
end

-- fromUsage returns the state of kind under (p1, p2) that u leaves, at
-- now; a log is written at once, at t.
local function fromUsage(kind, u, p1, p2, key)
	local s = {}
	if kind == 'b' then
		local used = p2 - share(u, p2)
		if used > 0 then
			local cap = p2 * p1
			local debt = used * p1
			if used == p2 then debt = max(debt, u.retry + cap - p1) end
			if debt > P52 then debt = P52 end
			s = {tat = now + debt}
		end
	elseif kind == 'q' then
		local size = floordiv(p2, p1) + 1
		local free = share(u, size)
		if free < size then
			if free > 0 then
				s = {tat = now + p2 - (free - 1) * p1}
			else
				s = {tat = now + p2 + max(u.retry, 1)}
			end
		end
	elseif kind == 'w' then
		local used = p2 - share(u, p2)
		if used > 0 then s = {start = now - libM().absmod(now, p1), count = used} end
	elseif kind == 'c' then
		local used = p2 - share(u, p2)
		if used > 0 then
			s = {start = now - libM().absmod(now, p1), prev = 0, curr = used}
			if used == p2 then
				local e = now + u.retry - (s.start + p1)
				if e > p1 - 1 then e = p1 - 1 end
				if e > 0 then s.curr = s.curr + libM().muldivceil(p2, e, p1 - e) end
			end
		end
	else
		local used = p2 - share(u, p2)
		if used <= 0 then return {} end
		local hold = max(u.reset, u.retry, 1)
		if hold > p1 then hold = p1 end
		local t = now - p1 + hold
		libL().rewrite({key = key}, 2, t, used)
		return nil, t
	end
	return s
end

-- carry translates the usage of the newest older kind a's key has into a
-- state of a's kind, and marks the old key; nil when there is none. The
-- translation is made at the time of the change, as the memory store makes
-- it when the new kind is registered (the clock is set back for it).
local function carry(a)
	local fl = fromList(a.from)
	for _, f in ipairs(fl) do
		local untl, at = rel(f.untl), rel(f.at)
		if untl and at and untl > now and at <= now then
			local okey = keyOf(a.key, fl.pos, f.kind)
			-- The clock is put back even if a read fails: the requests after
			-- this one in a batch decide at the real instant.
			local real = now
			now = at
			local ok, s, t, exists = pcall(function()
				local os, found = load(f.kind, okey, f.p1, f.p2, '', 0, '')
				if not found then return nil, nil, false end
				local ns, nt = fromUsage(a.kind, usage(f.kind, os, f.p1, f.p2), a.p1, a.p2, a.key)
				return ns, nt, true
			end)
			now = real
			if not ok then error(s) end
			if exists then
				redis.call('SET', okey, string.format('m%s:%d:%d:%d', a.kind, a.param, a.p2, fl.pos), 'KEEPTTL')
				if t then
					redis.call('PEXPIRE', a.key, px(t + a.p1))
					return libL().load(a.key)
				end
				store(a.kind, a.key, s, a.param, a.lin, a.gen, a.p1)
				return s
			end
		end
	end
	return nil
end

-- loadItem is load, with the change of kind: a key marked as moved is
-- decided by the kind it moved to, unless a's zone is the newer one.
local function loadItem(a)
	local s, exists, moved = load(a.kind, a.key, a.param, a.p2, a.lin, a.gen, a.hist)
	if exists or a.from == '' and not moved then return s end
	if moved then
		local k, p1, p2, pos = string.match(moved, '^m(%a):(%d+):(%d+):(%d+)')
		local kc = keyOf('b', 1, k or a.kind)
		if kc ~= keyOf('b', 1, a.kind) and not (a.from ~= '' and fromList(a.from).has[kc]) then
			a.kind, a.p1, a.p2 = k, tonumber(p1), tonumber(p2)
			a.param = a.p1
			a.key = keyOf(a.key, tonumber(pos), k)
			a.lin, a.gen, a.hist, a.from = '', 0, '', ''
			return (load(a.kind, a.key, a.p1, a.p2, '', 0, ''))
		end
	end
	if a.from ~= '' then return carry(a) or s end
	return s
end

------------------------------------------------------------------------
-- LOCK-OUTS (backend/lockout.go, line for line). A key its limit denies is
-- locked out: every request of it is denied until the lock-out ends,
-- whatever its state says; denied again by its limit after a lock-out, it
-- serves the next step (the last one repeats). The record is a key of its
-- own, the state's key with the kind letter replaced by 'o' (the same hash
-- tag, one record whatever the algorithm), holding "<end, absolute
-- ns>:<level>" and expiring when its level is forgotten: a full longest
-- step after the end of its lock-out. It is read and written in the call
-- that decides, so every instance of a fleet sees a lock-out at once.

local lockoutSpecs = {}
local function lockoutOf(spec)
	local lo = lockoutSpecs[spec]
	if lo then return lo end
	local pos, rest = string.match(spec, '^(%d+)|(.*)$')
	lo = {pos = tonumber(pos), steps = {}}
	for d in string.gmatch(rest, '%d+') do lo.steps[#lo.steps + 1] = tonumber(d) end
	lo.longest = lo.steps[#lo.steps]
	lockoutSpecs[spec] = lo
	return lo
end

-- lockRead reads the record of a's key: level 0 when there is none (or
-- its end is out of the exact range: long forgotten).
local function lockRead(a)
	local lo = lockoutOf(a.lk)
	local rec = {key = keyOf(a.key, lo.pos, 'o'), lo = lo, level = 0}
	local v = redis.call('GET', rec.key)
	if v then
		local u, l = string.match(v, '^(%d+):(%d+)$')
		if u then
			rec.untl = rel(u)
			if rec.untl then rec.level = tonumber(l) end
		end
	end
	return rec
end

-- lockedOut denies r while rec's lock-out lasts (backend.LockedOut).
local function lockedOut(rec, r)
	if rec.level > 0 and rec.untl > now then
		local wait = rec.untl - now
		r[1] = 0
		r[3] = 0
		r[4] = wait
		r[5] = wait
		r[6] = 0
		rec.locked = true
	end
	return r
end

-- lockOut locks rec's key out after its limit denied r, unless it is
-- locked out already or r can never pass (backend.Lockout.Escalate), and
-- reports whether it did.
local function lockOut(rec, r)
	if rec.locked or r[1] ~= 0 or r[4] == -1 then return false end
	local lo = rec.lo
	local level = 1
	if rec.level > 0 and now - rec.untl < lo.longest then
		level = rec.level + 1
		if level > #lo.steps then level = #lo.steps end
	end
	local untl = now + lo.steps[level]
	redis.call('SET', rec.key, abs(untl) .. ':' .. level, 'PX', px(untl + lo.longest))
	r[3] = 0
	r[4] = untl - now
	r[5] = r[4]
	r[6] = 0
	return true
end

------------------------------------------------------------------------

-- readArgs reads the arguments of n keys, KEYS[k0 + 1 .. k0 + n], from
-- ARGV[o0 + 1] on.
local function readArgs(k0, o0, n)
	local args = {}
	for i = 1, n do
		local o = o0 + (i - 1) * F
		args[i] = {
			key = KEYS[k0 + i],
			kind = ARGV[o + 1],
			p1 = tonumber(ARGV[o + 2]),
			p2 = tonumber(ARGV[o + 3]),
			cost = tonumber(ARGV[o + 4]),
			x1 = ARGV[o + 5],
			x2 = ARGV[o + 6],
			lin = ARGV[o + 7],
			gen = tonumber(ARGV[o + 8]),
			hist = ARGV[o + 9],
			from = ARGV[o + 10],
			lk = ARGV[o + 11],
		}
		local a = args[i]
		if not a.p1 then
			local t, r = string.match(ARGV[o + 2], '^(%d+)/(%d+)$')
			if t then
				a.p1, a.param = tonumber(t), tonumber(r)
			else
				calArg(a, ARGV[o + 2])
			end
		end
		a.param = a.param or a.p1
	end
	return args
end

-- refundOne gives back what a granted decision took from the key of a.
local function refundOne(a)
	local key = a.key
	local s, exists = load(a.kind, key, a.param, a.p2, a.lin, a.gen, a.hist)
	-- A bucket's refund and settle add ":<when it was to be full again>".
	local x1, till = a.x1, nil
	local c = string.find(x1, ':', 1, true)
	if c then
		till = rel(sub(x1, c + 1))
		x1 = sub(x1, 1, c - 1)
	end
	local at = rel(x1) or -P53
	local k = a.kind
	if k == 'l' then
		libL().refund(s, a.cost, at, key, a.p1)
	elseif exists then
		local r
		if k == 'b' then
			r = libB().refund(s, a.p1, a.cost, till)
		elseif k == 'q' then
			r = libB().qrefund(s, a.p1, a.cost, at, tonumber(a.x2))
		elseif k == 'w' then
			r = libW().refund(s, a.p1, a.cost, at, a.cal)
		else
			r = libC().refund(s, a.p1, a.cost, at)
		end
		-- Nothing to give back leaves the key as it is (a state idle now
		-- is not idle for a clock that steps back).
		if r ~= s then store(k, key, r, a.param, a.lin, a.gen, a.p1, a.cal) end
	end
end

------------------------------------------------------------------------
-- SPEND BUDGETS: reservations (backend/redis/budget.go). A decision whose
-- x2 is "<ttl ms>:t<token>" reserves the units it takes: the member
-- "t<token>:<time of the decision, ns>:<cost>" of the sorted set <key>:R,
-- scored by its deadline in ms. Committing removes the member; releasing
-- removes it and, only if it was there, refunds the units; a member past
-- its deadline is released by the next decision of the key, so the
-- reservation of a Caddy that died comes back with no Caddy left to give
-- it back. The set lives as long as the state it holds units of.

local function nowMs()
	return NS * 1000 + floordiv(NN, E6)
end

local function member(tok, at, cost)
	return tok .. ':' .. at .. ':' .. string.format('%d', cost)
end

-- expireDue releases the reservations of a's key whose deadline passed.
local function expireDue(a)
	local rk = a.key .. ':R'
	local t = nowMs()
	local due = redis.call('ZRANGEBYSCORE', rk, '-inf', t)
	if #due == 0 then return end
	for _, m in ipairs(due) do
		local at, cost = string.match(m, '^t%d+:(%d+):(%d+)$')
		if at then
			refundOne({key = a.key, kind = a.kind, p1 = a.p1, param = a.param, cost = tonumber(cost), x1 = at, x2 = '0',
				lin = a.lin, gen = a.gen, hist = a.hist, cal = a.cal})
		end
	end
	redis.call('ZREMRANGEBYSCORE', rk, '-inf', t)
end

-- holdReservations records the reservations of an allowed request.
local function holdReservations(args, results)
	for i = 1, #args do
		local a = args[i]
		local ttl, tok = string.match(a.x2, '^(%d+):(t%d+)$')
		if ttl and results[i][1] == 1 and a.cost > 0 then
			ttl = tonumber(ttl)
			local rk = a.key .. ':R'
			redis.call('ZADD', rk, nowMs() + ttl, member(tok, abs(now), a.cost))
			local keep = max(redis.call('PTTL', a.key), redis.call('PTTL', rk), ttl) + EXTRA
			redis.call('PEXPIRE', rk, keep)
		end
	end
end

-- capRetry tells a denied reserving key the sooner of its wait and its
-- earliest reservation's deadline: that one may come back first.
local function capRetry(args, results, out, o)
	for i = 1, #args do
		local a, r = args[i], results[i]
		if r[1] == 0 and r[4] > 0 and string.find(a.x2, ':t', 1, true) then
			local first = redis.call('ZRANGE', a.key .. ':R', 0, 0, 'WITHSCORES')
			if first[2] then
				local w = (tonumber(first[2]) - NS * 1000) * E6 - NN
				if w < 1 then w = 1 end
				if w < r[4] then
					r[4] = w
					out[o + 1 + (i - 1) * 7 + 4] = w
				end
			end
		end
	end
end

-- settleOne commits (mode k) or releases (mode e) the reservation of a:
-- x1 is the decision's time, x2 its token. An undo (mode x) of a
-- reserving decision drops its reservation the same way.
local function settleOne(a, release)
	if redis.call('ZREM', a.key .. ':R', member(a.x2, a.x1, a.cost)) == 1 and release then
		refundOne(a)
	end
end
-- END SPEND BUDGETS

-- decideKeys decides the keys of one request, all or nothing, and writes
-- the reply from out[o + 1] on: 1 if the request may proceed, then 7
-- values per key; with undo, then 3 more per key (see the top).
local function decideKeys(args, undo, out, o)
	local n = #args
	local states = {}
	local before = {}
	for i = 1, n do
		local a = args[i]
		if string.find(a.x2, ':t', 1, true) then expireDue(a) end
		states[i] = loadItem(a)
		-- (A log is given back by its refund, which is exact: no copy.)
		if undo and a.kind ~= 'l' then
			before[i] = {redis.call('GET', a.key) or '', redis.call('PTTL', a.key)}
		elseif undo then
			before[i] = {'', 0}
		end
	end

	local results = {}
	local recs -- LOCK-OUTS: the records of the keys of limits with lockout
	local allowed = true
	out[o + 1] = 1
	for i = 1, n do
		local a, s = args[i], states[i]
		local k = a.kind
		local r
		if k == 'b' then
			r = libB().decide(s, a.p1, a.p2, a.cost)
		elseif k == 'q' then
			r = libB().qdecide(s, a.p1, a.p2, a.cost)
		elseif k == 'w' then
			r = libW().decide(s, a.p1, a.p2, a.cost, a.cal)
		elseif k == 'c' then
			r = libC().decide(s, a.p1, a.p2, a.cost)
		else
			r = libL().decide(s, a.p1, a.p2, a.cost)
		end
		if a.lk ~= '' then -- LOCK-OUTS
			recs = recs or {}
			recs[i] = lockRead(a)
			r = lockedOut(recs[i], r)
		end
		results[i] = r
		if r[1] == 0 and a.x1 ~= '1' then allowed = false end
		local b = o + 1 + (i - 1) * 7
		for j = 1, 6 do out[b + j] = r[j] end
		out[b + 7] = 0
	end
	if not allowed then
		out[o + 1] = 0
		capRetry(args, results, out, o)
	end

	-- ADMIN MODES: the admin script (admin.lua) is inserted here.

	-- LOCK-OUTS: a key its limit denied (not a shadow request's) is locked
	-- out in the call that denied it.
	if recs and not allowed then
		for i = 1, n do
			local r = results[i]
			if recs[i] and args[i].x1 ~= '1' and lockOut(recs[i], r) then
				local b = o + 1 + (i - 1) * 7
				for j = 1, 6 do out[b + j] = r[j] end
			end
		end
	end

	for i = 1, n do
		local a, s, key = args[i], states[i], args[i].key
		if not allowed or results[i][1] == 0 or a.cost == 0 then
			if a.kind == 'l' then libL().keep(s, key) end
		else
			local k = a.kind
			if k == 'l' then
				local t = libL().take(s, a.p1, a.cost, key)
				-- A clock that stepped back logs the event at the newest
				-- time; the caller needs that time to give the event back.
				out[o + 1 + i * 7] = t - now
			else
				if k == 'b' or k == 'q' then
					s = libB().take(s, a.p1, a.cost)
				elseif k == 'w' then
					s = libW().take(s, a.p1, a.cost, a.cal)
				else
					s = libC().take(s, a.p1, a.cost)
				end
				store(k, key, s, a.param, a.lin, a.gen, a.p1, a.cal)
			end
		end
	end
	if allowed then holdReservations(args, results) end
	if undo then
		for i = 1, n do
			local b = before[i]
			local new = ''
			if allowed and results[i][1] == 1 and args[i].cost > 0 and args[i].kind ~= 'l' then
				new = redis.call('GET', args[i].key) or ''
			end
			local u = o + 1 + n * 7 + (i - 1) * 3
			out[u + 1] = b[1]
			out[u + 2] = b[2]
			out[u + 3] = new
		end
	end
end

-- Many requests ('m'): each is decided on its own, all or nothing over its
-- own keys, in the order given, as if each were a call of its own at the
-- same instant. After the header, each request is the number of its keys
-- then their arguments; KEYS holds the requests' keys in the same order.
-- The reply is the clock, then per request its decision as in mode 'd'
-- (without the clock), or an error message alone: a request that fails
-- (its arguments or its keys, read or decided) does not fail the others.
local function decideRequest(k0, o, n, out, at)
	decideKeys(readArgs(k0, o, n), false, out, at)
end
if mode == 'm' then
	local out = {NS, NN}
	local k0, o = 0, 5
	local last = #ARGV
	while o <= last do
		local n = tonumber(ARGV[o])
		local at = #out
		local ok, err = pcall(decideRequest, k0, o, n, out, at)
		if not ok then
			for j = #out, at + 1, -1 do out[j] = nil end
			if type(err) == 'table' then err = err.err end
			out[at + 1] = tostring(err)
		end
		k0 = k0 + n
		o = o + 1 + n * F
	end
	return out
end

local n = #KEYS
local args = readArgs(0, 4, n)

-- SPEND BUDGETS: commit ('k') or release ('e') reservations.
if mode == 'k' or mode == 'e' then
	for i = 1, n do settleOne(args[i], mode == 'e') end
	return {}
end

-- A refund gives back each key in turn (one key may be refunded twice in
-- one request), so each state is read just before its refund.
if mode == 'r' then
	for i = 1, n do refundOne(args[i]) end
	return {}
end

-- SETTLE: a request's real cost once its response told it (settle.go,
-- algorithms' Settle). cost is the estimate the decision took, x1 the
-- decision's time, x2 the real cost. Less is given back as a refund of
-- the difference; more is charged past the limit: a bucket's debt (at
-- most 2^52 ns, or its capacity), a window's count (at most 2 * 10^15).
if mode == 's' then
	local MAXOWED = 2000000000000000
	for i = 1, n do
		local a = args[i]
		local k, est, act = a.kind, a.cost, tonumber(a.x2)
		-- A key whose usage moved to another kind of state (a reload that
		-- changed the algorithm) keeps its mark: nothing is written over it.
		local s, _, moved = load(k, a.key, a.param, a.p2, a.lin, a.gen, a.hist)
		if moved then
			-- settled nowhere: the request's units are in the other kind
		elseif k == 'l' then
			libL().settle(s, est, act, rel(a.x1) or -P53, a.key, a.p1)
		elseif act < est then
			a.cost = est - act
			refundOne(a)
		elseif act > est and k ~= 'q' then
			local extra = act - est
			local r
			if k == 'b' then
				local T = a.p1
				local most = max(a.p2 * T, P52)
				local d = 0
				if s.tat and s.tat > now then d = s.tat - now end
				if d < most then
					if extra > floordiv(most - d, T) then d = most else d = d + extra * T end
					r = {tat = now + d}
				end
			elseif k == 'w' then
				r = libW().take(s, a.p1, math.min(extra, MAXOWED))
				if r.count > MAXOWED then r.count = MAXOWED end
			else
				r = libC().take(s, a.p1, math.min(extra, MAXOWED))
				if r.curr > MAXOWED then r.curr = MAXOWED end
			end
			if r then store(k, a.key, r, a.param, a.lin, a.gen, a.p1) end
		end
	end
	return {}
end
-- END SETTLE

-- An undo takes back a decision that other slots of the same request
-- denied: a key nobody wrote since gets its value from before the decision
-- back, exactly; any other key (and every sliding log, whose refund is
-- exact) is refunded. After the F arguments of each key come three more
-- per key: the value before, its expiry (ms), the value written.
if mode == 'x' then
	for i = 1, n do
		if sub(args[i].x2, 1, 1) == 't' then settleOne(args[i], false) end
		local o = 4 + n * F + (i - 1) * 3
		local old, ttl, new = ARGV[o + 1], tonumber(ARGV[o + 2]), ARGV[o + 3]
		if args[i].kind ~= 'l' and new ~= '' and redis.call('GET', KEYS[i]) == new then
			if old == '' then
				redis.call('DEL', KEYS[i])
			elseif ttl == -1 then
				redis.call('SET', KEYS[i], old) -- it had no expiry (not ours)
			else
				if ttl < 1 then ttl = 1 end
				redis.call('SET', KEYS[i], old, 'PX', ttl)
			end
		else
			refundOne(args[i])
		end
	end
	return {}
end

-- Decide ('d'), or decide and reply what an undo needs ('u': the caller
-- sends several slots' calls and may have to take this one back).
local out = {NS, NN}
decideKeys(args, mode == 'u', out, 2)
return out
