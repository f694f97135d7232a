------------------------------------------------------------------------
-- A change of kind of state (algorithms/usage.go, line for line). The
-- first decision of a key under the new kind reads the key of the kind it
-- replaced (same hash tag, same slot), writes the new kind's state from
-- its usage, and leaves a forwarding mark in the old key ("m" then the
-- new kind, its p1, p2 and the place of the kind letter), under the old
-- key's expiry: a request of a config still on the old kind decides by the
-- new state, and a zone that comes back to the old kind reads the mark as
-- absent and translates again.

-- letterOf is the letter of a kind in the key: a queue keeps a bucket's
-- state.
local function letterOf(kind)
	if kind == KIND_QUEUE then return KIND_BUCKET end
	return kind
end

-- keyOf is key with the kind letter at pos replaced by kind's.
local function keyOf(key, pos, kind)
	return sub(key, 1, pos - 1) .. letterOf(kind) .. sub(key, pos + 1)
end

local froms = {}
local function fromList(spec)
	local v = froms[spec]
	if v then return v end
	local pos, rest = string.match(spec, '^(%d+)|(.*)$')
	v = {pos = tonumber(pos), has = {}}
	for k, p1, p2, at, untl in string.gmatch(rest, '(%a),(%d+),(%d+),(%d+),(%d+)') do
		v[#v + 1] = {kind = k, p1 = tonumber(p1), p2 = tonumber(p2), at = at, untl = untl}
		v.has[letterOf(k)] = true
	end
	froms[spec] = v
	return v
end

local function decideBy(kind, s, p1, p2, cost)
	if kind == KIND_BUCKET then return libB().decide(s, p1, p2, cost) end
	if kind == KIND_QUEUE then return libB().qdecide(s, p1, p2, cost) end
	if kind == KIND_WINDOW then return libW().decide(s, p1, p2, cost) end
	if kind == KIND_COUNTER then return libC().decide(s, p1, p2, cost) end
	return libL().decide(s, p1, p2, cost)
end

-- usage is Algorithm.Usage: a decision of no units gives the limit, the
-- room and the reset; one of a unit, when there is no room, the wait.
local function usage(kind, s, p1, p2)
	local r = decideBy(kind, s, p1, p2, 0)
	local u = {limit = r[KEY_REPLY_LIMIT], remaining = r[KEY_REPLY_REMAINING], retry = 0, reset = r[KEY_REPLY_RESET]}
	if u.remaining == 0 then
		local d = decideBy(kind, s, p1, p2, 1)
		if d[KEY_REPLY_ALLOWED] == 0 then u.retry = d[KEY_REPLY_RETRY] end
	end
	return u
end

local function share(u, limit)
	if u.limit <= 0 or u.remaining <= 0 then return 0 end
	if u.remaining >= u.limit then return limit end
	local q = libM().muldiv(u.remaining, limit, u.limit)
	if q > limit then q = limit end
	return q
end

-- fromUsage returns the state of kind under (p1, p2) that u leaves, at
-- now; a log is written at once, at t.
local function fromUsage(kind, u, p1, p2, key)
	local s = {}
	if kind == KIND_BUCKET then
		local used = p2 - share(u, p2)
		if used > 0 then
			local cap = p2 * p1
			local debt = used * p1
			if used == p2 then debt = max(debt, u.retry + cap - p1) end
			if debt > P52 then debt = P52 end
			s = {tat = now + debt}
		end
	elseif kind == KIND_QUEUE then
		local size = floordiv(p2, p1) + 1
		local free = share(u, size)
		if free < size then
			if free > 0 then
				s = {tat = now + p2 - (free - 1) * p1}
			else
				s = {tat = now + p2 + max(u.retry, 1)}
			end
		end
	elseif kind == KIND_WINDOW then
		local used = p2 - share(u, p2)
		if used > 0 then s = {start = now - libM().absmod(now, p1), count = used} end
	elseif kind == KIND_COUNTER then
		local used = p2 - share(u, p2)
		if used > 0 then
			s = {start = now - libM().absmod(now, p1), prev = 0, curr = used}
			if used == p2 then
				local e = now + u.retry - (s.start + p1)
				if e > p1 - 1 then e = p1 - 1 end
				if e > 0 then s.curr = s.curr + libM().muldivceil(p2, e, p1 - e) end
			end
		end
	else
		local used = p2 - share(u, p2)
		if used <= 0 then return {} end
		local hold = max(u.reset, u.retry, 1)
		if hold > p1 then hold = p1 end
		local t = now - p1 + hold
		libL().rewrite({key = key}, 2, t, used)
		return nil, t
	end
	return s
end

-- carry translates the usage of the newest older kind a's key has into a
-- state of a's kind, and marks the old key; nil when there is none. The
-- translation is made at the time of the change, as the memory store makes
-- it when the new kind is registered (the clock is set back for it).
local function carry(a)
	local fl = fromList(a.from)
	for _, f in ipairs(fl) do
		local untl, at = rel(f.untl), rel(f.at)
		if untl and at and untl > now and at <= now then
			local okey = keyOf(a.key, fl.pos, f.kind)
			-- The clock is put back even if a read fails: the requests after
			-- this one in a batch decide at the real instant.
			local real = now
			now = at
			local ok, s, t, exists = pcall(function()
				local os, found = load(f.kind, okey, f.p1, f.p2, '', 0, '')
				if not found then return nil, nil, false end
				local ns, nt = fromUsage(a.kind, usage(f.kind, os, f.p1, f.p2), a.p1, a.p2, a.key)
				return ns, nt, true
			end)
			now = real
			if not ok then error(s) end
			if exists then
				redis.call('SET', okey, string.format('m%s:%d:%d:%d', a.kind, a.param, a.p2, fl.pos), 'KEEPTTL')
				if t then
					redis.call('PEXPIRE', a.key, px(t + a.p1))
					return libL().load(a.key)
				end
				store(a.kind, a.key, s, a.param, a.lin, a.gen, a.p1)
				return s
			end
		end
	end
	return nil
end

-- loadItem is load, with the change of kind: a key marked as moved is
-- decided by the kind it moved to, unless a's zone is the newer one.
local function loadItem(a)
	local s, exists, moved = load(a.kind, a.key, a.param, a.p2, a.lin, a.gen, a.hist)
	if exists or a.from == '' and not moved then return s end
	if moved then
		local k, p1, p2, pos = string.match(moved, '^m(%a):(%d+):(%d+):(%d+)')
		local kc = letterOf(k or a.kind)
		if kc ~= letterOf(a.kind) and not (a.from ~= '' and fromList(a.from).has[kc]) then
			a.kind, a.p1, a.p2 = k, tonumber(p1), tonumber(p2)
			a.param = a.p1
			a.key = keyOf(a.key, tonumber(pos), k)
			a.lin, a.gen, a.hist, a.from = '', 0, '', ''
			return (load(a.kind, a.key, a.p1, a.p2, '', 0, ''))
		end
	end
	if a.from ~= '' then return carry(a) or s end
	return s
end

