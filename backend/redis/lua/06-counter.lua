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
			r[KEY_REPLY_RETRY] = retry
		elseif r[KEY_REPLY_ALLOWED] == 1 and cost > 0 then
			r[KEY_REPLY_RESET] = c.start + 2 * W - now
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

