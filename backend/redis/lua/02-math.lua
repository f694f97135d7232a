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

