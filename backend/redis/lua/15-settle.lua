------------------------------------------------------------------------
-- SETTLE (MODE_SETTLE): a request's real cost once its response told it
-- (settle.go, algorithms' Settle). cost is the estimate the decision took,
-- x1 the decision's time, x2 the real cost. Less is given back as a refund
-- of the difference; more is charged past the limit: a bucket's debt (at
-- most 2^52 ns, or its capacity), a window's count (at most 2 * 10^15).
-- (A sliding log's settle is its own, libL().settle.)

local function settleKeys(args)
	local MAXOWED = 2000000000000000
	for i = 1, #args do
		local a = args[i]
		local k, est, act = a.kind, a.cost, tonumber(a.x2)
		-- A key whose usage moved to another kind of state (a reload that
		-- changed the algorithm) keeps its mark: nothing is written over it.
		local s, _, moved = load(k, a.key, a.param, a.p2, a.lin, a.gen, a.hist)
		if moved then
			-- settled nowhere: the request's units are in the other kind
		elseif k == KIND_LOG then
			libL().settle(s, est, act, rel(a.x1) or -P53, a.key, a.p1)
		elseif act < est then
			a.cost = est - act
			refundOne(a)
		elseif act > est and k ~= KIND_QUEUE then
			local extra = act - est
			local r
			if k == KIND_BUCKET then
				local T = a.p1
				local most = max(a.p2 * T, P52)
				local d = 0
				if s.tat and s.tat > now then d = s.tat - now end
				if d < most then
					if extra > floordiv(most - d, T) then d = most else d = d + extra * T end
					r = {tat = now + d}
				end
			elseif k == KIND_WINDOW then
				r = libW().take(s, a.p1, math.min(extra, MAXOWED))
				if r.count > MAXOWED then r.count = MAXOWED end
			else
				r = libC().take(s, a.p1, math.min(extra, MAXOWED))
				if r.curr > MAXOWED then r.curr = MAXOWED end
			end
			if r then store(k, a.key, r, a.param, a.lin, a.gen, a.p1) end
		end
	end
end
