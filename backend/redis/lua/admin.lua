-- Sluice: an operator's operations on keys, inserted into the script
-- (lua/14-decide.lua) where it marks them (after every key is loaded and decided, before anything
-- is written), so that they read and store states with its functions.
-- It runs inside decideKeys: a `return` here ends that request's decision
-- before its writes, and the script replies the decision made so far.
-- Modes:
--   MODE_PEEK: replies as a decision does, writing nothing (the same key
--       is sent with cost 0 for its state, and cost 1 for its retry time).
--   MODE_GRANT: gives each key cost units back, whatever took them, never
--       more than it holds (algorithms/grant.go, line for line).
-- Reset needs no script: it deletes the key.

-- A peek is a decision that writes nothing: the states are loaded and
-- decided above, and nothing is stored.
if mode == MODE_PEEK then return out end

-- grantCounter takes units out of the current window's count, then lowers
-- the previous window's count until its weighted share is that much
-- smaller: ⌊p·m/W⌋ ≤ t ⇔ p ≤ ⌈(t+1)·W/m⌉ − 1, with m = W − elapsed.
local function grantCounter(s, W, units)
	if not s.start then return s end
	local M = libM()
	local start = now - M.absmod(now, W)
	local c, e
	if start <= s.start then
		c = {start = s.start, prev = s.prev, curr = s.curr}
		e = max(now - s.start, 0)
	elseif start == s.start + W then
		c = {start = start, prev = s.curr, curr = 0}
		e = now - start
	else
		return s -- nothing counted any more
	end
	if c.curr == 0 and c.prev == 0 then return s end
	local take = units
	if take > c.curr then take = c.curr end
	c.curr = c.curr - take
	units = units - take
	if units > 0 and c.prev > 0 then
		local t = M.muldiv(c.prev, W - e, W) - units
		if t < 0 then
			c.prev = 0
		else
			local p = M.muldivceil(t + 1, W, W - e) - 1
			if p < c.prev then c.prev = p end
		end
	end
	return c
end

-- grantLog gives back the newest live units: the log's own function, which
-- knows how its events and their units are stored.
local function grantLog(l, units, key, W)
	libL().grant(l, units, key, W)
end

-- A grant reads the states loaded (and rebased) above; a key that does
-- not exist has nothing to give back.
if mode == MODE_GRANT then
	for i = 1, n do
		local a, key, s = args[i], args[i].key, states[i]
		local k = a.kind
		if k == KIND_LOG then
			grantLog(s, a.cost, key, a.p1)
		elseif next(s) ~= nil then
			local r
			if k == KIND_BUCKET or k == KIND_QUEUE then
				r = libB().refund(s, a.p1, a.cost)
			elseif k == KIND_WINDOW then
				-- As a refund of a request taken in the window the key is
				-- in, even if the clock stepped back out of it.
				r = libW().refund(s, a.p1, a.cost, P53, a.cal)
			else
				r = grantCounter(s, a.p1, a.cost)
			end
			if r ~= s then store(k, key, r, a.param, a.lin, a.gen, a.p1, a.cal) end
		end
	end
	return {}
end
