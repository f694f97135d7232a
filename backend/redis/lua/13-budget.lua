------------------------------------------------------------------------
-- SPEND BUDGETS: reservations (backend/redis/budget.go). A decision whose
-- x2 is "<ttl ms>:t<token>" reserves the units it takes: the member
-- "t<token>:<time of the decision, ns>:<cost>" of the sorted set at the
-- state's key and RESERVATIONS_SUFFIX, scored by its deadline in ms.
-- Committing removes the member; releasing removes it and, only if it was
-- there, refunds the units; a member past its deadline is released by the
-- next decision of the key, so the reservation of a Caddy that died comes
-- back with no Caddy left to give it back. The set lives as long as the
-- state it holds units of.

local function nowMs()
	return NS * 1000 + floordiv(NN, E6)
end

local function member(tok, at, cost)
	return tok .. ':' .. at .. ':' .. string.format('%d', cost)
end

-- expireDue releases the reservations of a's key whose deadline passed.
local function expireDue(a)
	local rk = a.key .. RESERVATIONS_SUFFIX
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
		local ttl, tok
		if a.x2 ~= '' then ttl, tok = string.match(a.x2, '^(%d+):(t%d+)$') end
		if ttl and results[i][KEY_REPLY_ALLOWED] == 1 and a.cost > 0 then
			ttl = tonumber(ttl)
			local rk = a.key .. RESERVATIONS_SUFFIX
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
		if r[KEY_REPLY_ALLOWED] == 0 and r[KEY_REPLY_RETRY] > 0 and string.find(a.x2, ':t', 1, true) then
			local first = redis.call('ZRANGE', a.key .. RESERVATIONS_SUFFIX, 0, 0, 'WITHSCORES')
			if first[2] then
				local w = (tonumber(first[2]) - NS * 1000) * E6 - NN
				if w < 1 then w = 1 end
				if w < r[KEY_REPLY_RETRY] then
					r[KEY_REPLY_RETRY] = w
					out[o + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES + KEY_REPLY_RETRY] = w
				end
			end
		end
	end
end

-- settleOne commits (MODE_COMMIT) or releases (MODE_RELEASE) the
-- reservation of a: x1 is the decision's time, x2 its token. An undo
-- (MODE_UNDO) of a reserving decision drops its reservation the same way.
local function settleOne(a, release)
	if redis.call('ZREM', a.key .. RESERVATIONS_SUFFIX, member(a.x2, a.x1, a.cost)) == 1 and release then
		refundOne(a)
	end
end
-- END SPEND BUDGETS
