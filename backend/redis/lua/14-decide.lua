
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
