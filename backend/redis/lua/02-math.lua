------------------------------------------------------------------------
-- Exact integer arithmetic past 2^53 in Lua's doubles (libM): products
-- over quotients, and times modulo a window aligned to the epoch.

-- muldiv is floor(a*b/c) and the remainder, exactly, for integers
-- 0 <= a, b < 2^53 and 1 <= c <= 2^52, by binary long multiplication with
-- the running quotient and remainder (r < c keeps 2r and r + b mod c below
-- 2^53). A quotient above most (default 2^52, below 2^53) saturates to P53
-- (remainder -1).
-- basemod is absmod's base per window length: the current second's, so a
-- call starts it afresh (17-main.lua).
local basemod
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

	Mlib = {muldiv = muldiv, muldivceil = muldivceil, absmod = absmod}
	return Mlib
end
