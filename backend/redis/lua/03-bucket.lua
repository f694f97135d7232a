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

