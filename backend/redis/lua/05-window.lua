------------------------------------------------------------------------
-- Fixed window: {start, count} (start nil: a fresh key).

-- counted is the part the window algorithms share (algorithms.counted).
-- Result: {allowed, limit, remaining, retry, reset, delay}, a key's values
-- in a decision's reply (KEY_REPLY_ALLOWED to KEY_REPLY_DELAY), as every
-- algorithm's decide returns them; done.
local function counted(limit, used, cost, reset)
	local r = {0, limit, limit - used, 0, reset, 0}
	if r[KEY_REPLY_REMAINING] < 0 then r[KEY_REPLY_REMAINING] = 0 end
	if cost == 0 then
		r[KEY_REPLY_ALLOWED] = 1
		return r, true
	elseif cost > limit then
		r[KEY_REPLY_RETRY] = -1
		return r, true
	elseif used + cost <= limit then
		r[KEY_REPLY_ALLOWED] = 1
		r[KEY_REPLY_REMAINING] = limit - used - cost
		return r, true
	end
	return r, false
end

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
		if not done then r[KEY_REPLY_RETRY] = stop end
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

