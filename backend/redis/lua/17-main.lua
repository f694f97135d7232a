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
