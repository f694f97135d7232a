------------------------------------------------------------------------
-- Deciding one request: every key, all or nothing.

-- decideKeys decides the keys of one request, all or nothing, and writes
-- the decision from out[o + 1] on: DECISION_ALLOWED, then KEY_REPLY_VALUES
-- values per key; with undo, then UNDO_VALUES more per key.
local function decideKeys(args, undo, out, o)
	local n = #args
	local states = {}
	local before = undo and {}
	for i = 1, n do
		local a = args[i]
		-- (x2 is empty but for a reservation.)
		if a.x2 ~= '' and string.find(a.x2, ':t', 1, true) then expireDue(a) end
		states[i] = loadItem(a)
		-- (A log is given back by its refund, which is exact: no copy.)
		if undo and a.kind ~= KIND_LOG then
			before[i] = {redis.call('GET', a.key) or '', redis.call('PTTL', a.key)}
		elseif undo then
			before[i] = {'', 0}
		end
	end

	local results = {}
	local recs -- LOCK-OUTS: the records of the keys of limits with lockout
	local allowed = true
	out[o + DECISION_ALLOWED] = 1
	for i = 1, n do
		local a, s = args[i], states[i]
		local k = a.kind
		local r
		if k == KIND_BUCKET then
			r = libB().decide(s, a.p1, a.p2, a.cost)
		elseif k == KIND_QUEUE then
			r = libB().qdecide(s, a.p1, a.p2, a.cost)
		elseif k == KIND_WINDOW then
			r = libW().decide(s, a.p1, a.p2, a.cost, a.cal)
		elseif k == KIND_COUNTER then
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
		if r[KEY_REPLY_ALLOWED] == 0 and a.x1 ~= DECIDE_SHADOW then allowed = false end
		local b = o + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES
		for j = KEY_REPLY_ALLOWED, KEY_REPLY_DELAY do out[b + j] = r[j] end
		out[b + KEY_REPLY_LOGGED] = 0
	end
	if not allowed then
		out[o + DECISION_ALLOWED] = 0
		capRetry(args, results, out, o)
	end

	-- ADMIN MODES: the admin script (admin.lua) is inserted here.

	-- LOCK-OUTS: a key its limit denied (not a shadow request's) is locked
	-- out in the call that denied it.
	if recs and not allowed then
		for i = 1, n do
			local r = results[i]
			if recs[i] and args[i].x1 ~= DECIDE_SHADOW and lockOut(recs[i], r) then
				local b = o + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES
				for j = KEY_REPLY_ALLOWED, KEY_REPLY_DELAY do out[b + j] = r[j] end
			end
		end
	end

	for i = 1, n do
		local a, s, key = args[i], states[i], args[i].key
		if not allowed or results[i][KEY_REPLY_ALLOWED] == 0 or a.cost == 0 then
			if a.kind == KIND_LOG then libL().keep(s, key) end
		else
			local k = a.kind
			if k == KIND_LOG then
				local t = libL().take(s, a.p1, a.cost, key)
				-- A clock that stepped back logs the event at the newest
				-- time; the caller needs that time to give the event back.
				out[o + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES + KEY_REPLY_LOGGED] = t - now
			else
				if k == KIND_BUCKET or k == KIND_QUEUE then
					s = libB().take(s, a.p1, a.cost)
				elseif k == KIND_WINDOW then
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
			local b = before[i] -- the value and its expiry
			local new = ''
			if allowed and results[i][KEY_REPLY_ALLOWED] == 1 and args[i].cost > 0 and args[i].kind ~= KIND_LOG then
				new = redis.call('GET', args[i].key) or ''
			end
			local u = o + DECISION_HEAD_VALUES + n * KEY_REPLY_VALUES + (i - 1) * UNDO_VALUES
			out[u + UNDO_BEFORE] = b[1]
			out[u + UNDO_EXPIRY] = b[2]
			out[u + UNDO_AFTER] = new
		end
	end
end

-- shorten rewrites the decision of one key at out[at + 1] on as a short
-- decision (SHORT_VALUES) when it is one: allowed by the key, with the
-- zone's p2 as the limit, no retry, delay or logged time.
local function shorten(out, at, p2)
	local b = at + DECISION_HEAD_VALUES
	if out[at + DECISION_ALLOWED] == 1 and out[b + KEY_REPLY_ALLOWED] == 1 and out[b + KEY_REPLY_LIMIT] == p2
		and out[b + KEY_REPLY_RETRY] == 0 and out[b + KEY_REPLY_DELAY] == 0 and out[b + KEY_REPLY_LOGGED] == 0 then
		local left, reset = out[b + KEY_REPLY_REMAINING], out[b + KEY_REPLY_RESET]
		for j = b + KEY_REPLY_VALUES, at + 1, -1 do out[j] = nil end
		out[at + SHORT_REMAINING], out[at + SHORT_RESET] = -1 - left, reset
	end
end

-- keyOut writes a key's values of a decision from out[b + 1] on.
local function keyOut(out, b, ok, limit, left, retry, reset, logged)
	out[b + KEY_REPLY_ALLOWED] = ok
	out[b + KEY_REPLY_LIMIT] = limit
	out[b + KEY_REPLY_REMAINING] = left
	out[b + KEY_REPLY_RETRY] = retry
	out[b + KEY_REPLY_RESET] = reset
	out[b + KEY_REPLY_DELAY] = 0
	out[b + KEY_REPLY_LOGGED] = logged
end

-- absStr is abs(t), from the strings of its numbers.
local function absStr(t)
	local sec, ns = absOf(t)
	if sec == 0 then return abs(t) end
	return (strOf[sec] or str(sec)) .. string.format('%09d', ns)
end

-- plainCount decides a cost against the count of a window or a log, as
-- counted does, without its table: allowed (1 or 0), the units left, and
-- the retry (0 when allowed, -1 when the cost can never pass), or nil
-- when the caller's state tells when the cost would pass.
local function plainCount(limit, count, cost)
	local left = limit - count
	if left < 0 then left = 0 end
	if cost == 0 then return 1, left, 0 end
	if cost > limit then return 0, left, -1 end
	if count + cost <= limit then return 1, limit - count - cost, 0 end
	return 0, left, nil
end

-- windowStart is the start of the current window of a zone of fixed
-- windows, the same for the whole call.
local function windowStart(z)
	local start = now - libM().absmod(now, z.p1)
	z.wstart = start
	return start
end

-- plainValue is store's value of a plain bucket's time t, or of a fixed
-- window's start t and count c, and its expiry in ms.
local function plainValue(z, t, c)
	local v, idle
	if z.kind == KIND_BUCKET then
		v, idle = absStr(t) .. z.meta, t
	else
		v, idle = absStr(t) .. ':' .. (strOf[c] or str(c)) .. z.meta, t + z.p1
	end
	local ms = px(idle)
	return v, strOf[ms] or str(ms)
end

-- Most keys of most zones are absent when a request reads them (a client's
-- bucket expires soon after its request): for a request of one such key,
-- writing the value its absence would write, with SET NX, decides it in
-- one command instead of a GET and a SET. A key that is there makes the
-- SET NX a command in vain, so a zone writes first only while most of its
-- keys were absent lately: absentScore[meta] (01-base.lua) rises by 1 for
-- each absent key and falls by 2 for each present one, between ABSENT_LOW
-- and ABSENT_HIGH, and the zone writes first while it is not negative
-- (more than two in three absent). The choice changes what a request costs
-- Redis, never its decision, value or expiry.
local ABSENT_LOW = -4
local ABSENT_HIGH = 3
local function scoreAbsent(meta, absent)
	local s = absentScore[meta]
	if not s then
		memoRoom()
		s = 0
	end
	if absent then
		s = s + 1
		if s > ABSENT_HIGH then s = ABSENT_HIGH end
	else
		s = s - 2
		if s < ABSENT_LOW then s = ABSENT_LOW end
	end
	absentScore[meta] = s
end

-- decideAbsent decides a request of the one key key, of a plain bucket or
-- fixed window zone z and a cost 0 < cost <= z.p2, as decidePlain would
-- were the key absent, and writes that decision from out[at + 1] on if
-- the key is absent (its value written by SET NX); it returns false,
-- having written nothing, if the key is there, whatever its type.
local function decideAbsent(key, z, cost, out, at)
	local t, c, left, reset
	if z.kind == KIND_BUCKET then
		-- bucketDecide and bucketTake of no debt.
		local T = z.p1
		local cap, nd = z.p2 * T, cost * T
		t, reset = now + nd, nd
		if nd >= cap then left = 0 else left = floordiv(cap - nd, T) end
	else
		-- windowDecide and windowTake of the current window, empty.
		t = z.wstart or windowStart(z)
		c, left, reset = cost, z.p2 - cost, t + z.p1 - now
	end
	local v, ms = plainValue(z, t, c)
	if not redis.call('SET', key, v, 'PX', ms, 'NX') then return false end
	out[at + DECISION_ALLOWED] = 1
	out[at + SHORT_REMAINING], out[at + SHORT_RESET] = -1 - left, reset
	return true
end

-- decidePlain decides, as decideKeys would, a request of MODE_MANY whose
-- keys are all plain buckets, fixed windows or sliding logs: each of a
-- zone that has meta or plainLog (zoneArgs), without a reservation, and
-- absent or written under the zone's current policy (its value ends with
-- meta, so no policy change rebases it), or a small log of single units
-- (logPlainRead). It reads the request's n keys, KEYS[k0 + 1] on, and their
-- arguments, which decideMany puts in zs, costs, x1s and x2s (their zones,
-- costs, x1 and x2; zis the zones' places), and writes the decision from
-- out[at + 1] on. That is most decisions, and decideKeys's tables (the arguments,
-- the states, each result and taken state) cost more than a GET and a
-- SET: this keeps the numbers in locals and scratch tables (kept from
-- call to call), with the arithmetic of bucketDecide and bucketTake, of
-- windowDecide and windowTake, of logDecide, and of store written out
-- (logTake and logKeep, logPlainTake and logPlainKeep). It returns
-- false, having written nothing, for any other request; decideKeys
-- decides it. The decision of one key is written short when it is one
-- (shorten), as decideMany writes decideKeys's.
local zis, zs, costs, x1s, x2s = {}, {}, {}, {}, {}
local ts, counts, takes = {}, {}, {}
-- A log's string, base second, stored head, pruned head and events
-- (logPlainRead, 07-slidinglog.lua).
local raws, ds, h0s, hs, ns = {}, {}, {}, {}, {}
local function decidePlain(k0, n, out, at)
	for i = 1, n do
		local z = zs[i]
		if not (z.meta or z.plainLog) or x2s[i] ~= '' then return false end
	end
	-- learn: the zone whose score (score) the key's GET tells
	-- (decideAbsent).
	local learn, score
	if n == 1 then
		local z, cost = zs[1], costs[1]
		-- One log and a cost of 1, most requests of a log zone: the
		-- loops and tables below cost a sixth of its decision.
		if z.plainLog and cost == 1 then
			local ok, left, retry, reset, logged = libL().plainOne(KEYS[k0 + 1], z.p1, z.p2)
			if not ok then return false end
			if ok == 1 or x1s[1] == DECIDE_SHADOW then
				out[at + DECISION_ALLOWED] = 1
			else
				out[at + DECISION_ALLOWED] = 0
			end
			if ok == 1 and logged == 0 then
				out[at + SHORT_REMAINING], out[at + SHORT_RESET] = -1 - left, reset
			else
				keyOut(out, at + DECISION_HEAD_VALUES, ok, z.p2, left, retry, reset, logged)
			end
			return true
		end
		if z.meta and cost > 0 and cost <= z.p2 then
			score = absentScore[z.meta]
			if score and score < 0 then
				learn = z.meta
			else
				local absent = decideAbsent(KEYS[k0 + 1], z, cost, out, at)
				scoreAbsent(z.meta, absent)
				if absent then return true end
			end
		end
	end
	-- The states, as load, parse and rel read them: ts[i] the time (a
	-- bucket's tat, a window's start; nil: none), counts[i] a window's
	-- count.
	for i = 1, n do
		local z, t, count = zs[i], nil, 0
		local raw
		if z.plainLog then
			local ok
			ok, raws[i], ds[i], h0s[i], hs[i], count, ns[i], t = libL().plainRead(KEYS[k0 + i], z.p1)
			if not ok then return false end
			count = count or 0
		else
			raw = redis.call('GET', KEYS[k0 + i])
			-- (A present key leaves the lowest score as it is.)
			if learn and (not raw or score > ABSENT_LOW) then scoreAbsent(learn, not raw) end
		end
		if raw then
			-- A time of 19 digits (from 2001 to 2286), a window's
			-- count, then meta; any other value is decideKeys's. A ':'
			-- among the 19 fails tonumber.
			local c = 20
			if z.kind == KIND_WINDOW then
				c = string.find(raw, ':', 21, true)
				if not c or string.byte(raw, 20) ~= 58 then return false end -- 58: ':'
				local cs = sub(raw, 21, c - 1)
				count = numOf[cs] or num(cs)
				if not count then return false end
			end
			if sub(raw, c) ~= z.meta then return false end
			local ss = sub(raw, 1, 10)
			local sec, ns = numOf[ss] or num(ss), tonumber(sub(raw, 11, 19))
			if not sec or not ns then return false end
			sec = sec - NS
			if sec < -FAR or sec > FAR then return false end
			t = sec * E9 + ns
		end
		ts[i], counts[i] = t, count
	end

	-- The decisions; takes[i] tells whether the key takes, ts[i] and
	-- counts[i] become the state it would write.
	local allowed, fits = true, true
	-- A request of one key writes its decision once its logged time is
	-- known, from these.
	local ok1, limit1, left1, retry1, reset1, logged1
	out[at + DECISION_ALLOWED] = 1
	for i = 1, n do
		local z, t, cost = zs[i], ts[i], costs[i]
		local ok, limit, left, retry, reset
		if z.plainLog then
			-- logDecide, with counted written out; t the newest event.
			local W, count = z.p1, counts[i]
			limit, reset = z.p2, 0
			if t and t + W > now then reset = t + W - now end
			ok, left, retry = plainCount(limit, count, cost)
			if ok == 1 and cost > 0 then
				if reset < W then reset = W end
				-- A cost other than 1 makes a log of format 2, and
				-- logTake's time past the base's exact range a rewrite:
				-- decideKeys's.
				if not t or t < now then t = now end
				if cost ~= 1 or raws[i] and t - ds[i] * E9 >= P52 then fits = false end
			elseif not retry then
				retry = libL().plainEvent(raws[i], ds[i], hs[i] + count + cost - limit) + W - now
			end
		elseif z.kind == KIND_BUCKET then
			local T, burst = z.p1, z.p2
			local cap = burst * T
			local d = 0
			if t and t > now then d = t - now end
			ok, limit, left, retry, reset = 0, burst, d, 0, d
			if cost > burst then
				retry = -1
			else
				local nd = d + cost * T
				if nd <= cap or cost == 0 then
					ok, left, reset = 1, nd, nd
					ts[i] = now + nd
				else
					retry = nd - cap
				end
			end
			if left >= cap then left = 0 else left = floordiv(cap - left, T) end
		else
			local W, count = z.p1, 0
			limit = z.p2
			local start = z.wstart or windowStart(z)
			if t and start <= t then start, count = t, counts[i] end
			local stop = start + W - now
			reset = stop
			if count == 0 and cost == 0 then reset = 0 end
			ok, left, retry = plainCount(limit, count, cost)
			if not retry then retry = stop end
			ts[i], counts[i] = start, count + cost
		end
		takes[i] = ok == 1 and cost > 0
		if ok == 0 and x1s[i] ~= DECIDE_SHADOW then allowed = false end
		if n == 1 then
			ok1, limit1, left1, retry1, reset1, logged1 = ok, limit, left, retry, reset, 0
		else
			keyOut(out, at + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES, ok, limit, left, retry, reset, 0)
		end
	end
	if allowed and not fits then return false end
	if not allowed then out[at + DECISION_ALLOWED] = 0 end
	-- store's values and expiries, and the logs (logTake, logKeep).
	for i = 1, n do
		local z = zs[i]
		if z.plainLog then
			local raw = raws[i]
			if allowed and takes[i] then
				local t = ts[i] -- logTake's time: the newest event's if the clock stepped back
				if not t or t < now then t = now end
				libL().plainTake(KEYS[k0 + i], z.p1, t, raw, ds[i], hs[i], counts[i], ns[i])
				if n == 1 then
					logged1 = t - now
				else
					out[at + DECISION_HEAD_VALUES + (i - 1) * KEY_REPLY_VALUES + KEY_REPLY_LOGGED] = t - now
				end
			elseif raw then
				libL().plainKeep(KEYS[k0 + i], ds[i], h0s[i], hs[i], counts[i], ns[i], ts[i])
			end
			raws[i] = nil
		elseif allowed and takes[i] then
			local v, ms = plainValue(z, ts[i], counts[i])
			redis.call('SET', KEYS[k0 + i], v, 'PX', ms)
		end
	end
	if n == 1 then
		-- (Allowed, the key's retry is 0 and its limit the zone's p2.)
		if allowed and ok1 == 1 and logged1 == 0 then
			out[at + SHORT_REMAINING], out[at + SHORT_RESET] = -1 - left1, reset1
		else
			keyOut(out, at + DECISION_HEAD_VALUES, ok1, limit1, left1, retry1, reset1, logged1)
		end
	end
	return true
end
