------------------------------------------------------------------------
-- Loading, rebasing and storing the O(1) states.

-- parse reads a stored value: the state, the rate parameter it was written
-- under, and its lineage and generation.
-- (One match, no table of fields: this runs for every key of every call.)
local function parse(kind, raw)
	local f1, f2, f3, f4, f5, f6 = string.match(raw, '^([^:]*):?([^:]*):?([^:]*):?([^:]*):?([^:]*):?([^:]*)')
	local t = rel(f1)
	if not t then return nil end
	if kind == KIND_BUCKET or kind == KIND_QUEUE then
		return {tat = t}, tonumber(f2), f3 ~= '' and f3 or nil, tonumber(f4) or 0
	elseif kind == KIND_WINDOW then
		return {start = t, count = tonumber(f2)}, tonumber(f3), f4 ~= '' and f4 or nil, tonumber(f5) or 0
	end
	return {start = t, prev = tonumber(f2), curr = tonumber(f3)}, tonumber(f4), f5 ~= '' and f5 or nil, tonumber(f6) or 0
end

local hists = {}
local function history(h)
	local v = hists[h]
	if v then return v end
	v = {}
	for at, gen, param, most in string.gmatch(h, '(%d+),(%d+),(%d+),(%d+)') do
		v[#v + 1] = {at = rel(at), gen = tonumber(gen), param = tonumber(param), most = tonumber(most)}
	end
	hists[h] = v
	return v
end

-- most bounds a bucket's debt (change.most in zones.go).
local function rebase(kind, s, at, old, new, most)
	if kind == KIND_BUCKET or kind == KIND_QUEUE then return libB().rebase(s, at, old, new, most) end
	if kind == KIND_WINDOW then return libW().rebase(s, at, old, new) end
	return libC().rebase(s, at, old, new)
end

-- load returns the key's state, rebased through the policy changes it has
-- not seen, as the memory store's table does: each change at its own time,
-- in order. A state written by a process with another history (another
-- instance of the fleet, or before a restart) is rebased from its own rate
-- to the current one now.
local function load(kind, key, param, p2, lin, gen, hist)
	if kind == KIND_LOG then
		local l, moved = libL().load(key)
		return l or {}, l ~= nil, moved
	end
	local raw = redis.call('GET', key)
	if not raw then return {}, false end
	if sub(raw, 1, 1) == 'm' then return {}, false, raw end -- a forwarding mark (09-kinds.lua)
	local s, kp, kl, kg = parse(kind, raw)
	if not s then return {}, true end
	if kl == nil or kl == lin then
		if hist ~= '' and kg < gen then
			for _, sw in ipairs(history(hist)) do
				if sw.gen > kg then
					if not sw.at then
						s = {}
					else
						s = rebase(kind, s, sw.at, kp, sw.param, sw.most)
					end
					kp = sw.param
				end
			end
		end
	end
	if kp ~= param then
		-- The current policy's bound: a queue's slots given out reach
		-- max_delay (p2) + the queue's size in intervals, past 2^52 for a
		-- 30-day window.
		local most = P52
		if kind == KIND_QUEUE then most = max(P52, p2 + (floordiv(p2, param) + 1) * param) end
		s = rebase(kind, s, now, kp, param, most)
	end
	return s, true
end

-- metaOf is the suffix of a stored value: the rate parameter and, after a
-- policy change, the lineage and generation. Numbers are written with %d:
-- Lua's own conversion keeps only 14 significant digits. The suffix is the
-- same for every key of a zone: it is made once per call.
local metas = {}
local function metaOf(param, lin, gen)
	local byLin = metas[param]
	if not byLin then
		byLin = {}
		metas[param] = byLin
	end
	local byGen = byLin[lin]
	if not byGen then
		byGen = {}
		byLin[lin] = byGen
	end
	local m = byGen[gen]
	if not m then
		m = string.format(':%d', param)
		if gen > 0 then m = m .. string.format(':%s:%d', lin, gen) end
		byGen[gen] = m
	end
	return m
end

-- store writes s with its expiry, or deletes the key when s is the zero
-- state.
local function store(kind, key, s, param, lin, gen, p1, cal)
	local v, idle
	local meta = metaOf(param, lin, gen)
	if kind == KIND_BUCKET or kind == KIND_QUEUE then
		if s.tat then
			idle = s.tat
			v = abs(s.tat) .. meta
		end
	elseif kind == KIND_WINDOW then
		-- A window emptied by refunds is kept to its end: after a change
		-- of window length its start may lie off the new grid, and the
		-- algorithm keeps such a start (it ends the window).
		if s.start then
			idle = s.start + p1
			if cal then idle = calEnd(cal, s.start, p1) end
			v = abs(s.start) .. string.format(':%d', s.count) .. meta
		end
	elseif s.start then
		if s.curr > 0 then
			idle = s.start + 2 * p1
		else
			idle = s.start + p1
		end
		v = abs(s.start) .. string.format(':%d:%d', s.prev, s.curr) .. meta
	end
	-- A state that is idle just now is still kept for a millisecond: a
	-- clock that steps back would see it in use again.
	if not idle then
		redis.call('DEL', key)
		return
	end
	redis.call('SET', key, v, 'PX', px(idle))
end

