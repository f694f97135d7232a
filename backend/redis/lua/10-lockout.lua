------------------------------------------------------------------------
-- LOCK-OUTS (backend/lockout.go, line for line). A key its limit denies is
-- locked out: every request of it is denied until the lock-out ends,
-- whatever its state says; denied again by its limit after a lock-out, it
-- serves the next step (the last one repeats). The record is a key of its
-- own, the state's key with the kind letter replaced by KIND_LOCKOUT (the
-- same hash tag, one record whatever the algorithm), holding "<end,
-- absolute ns>:<level>" and expiring when its level is forgotten: a full
-- longest step after the end of its lock-out. It is read and written in
-- the call that decides, so every instance of a fleet sees a lock-out at
-- once.

local lockoutSpecs = {}
local function lockoutOf(spec)
	local lo = lockoutSpecs[spec]
	if lo then return lo end
	local pos, rest = string.match(spec, '^(%d+)|(.*)$')
	lo = {pos = tonumber(pos), steps = {}}
	for d in string.gmatch(rest, '%d+') do lo.steps[#lo.steps + 1] = tonumber(d) end
	lo.longest = lo.steps[#lo.steps]
	lockoutSpecs[spec] = lo
	return lo
end

-- lockRead reads the record of a's key: level 0 when there is none (or
-- its end is out of the exact range: long forgotten).
local function lockRead(a)
	local lo = lockoutOf(a.lk)
	local rec = {key = keyOf(a.key, lo.pos, KIND_LOCKOUT), lo = lo, level = 0}
	local v = redis.call('GET', rec.key)
	if v then
		local u, l = string.match(v, '^(%d+):(%d+)$')
		if u then
			rec.untl = rel(u)
			if rec.untl then rec.level = tonumber(l) end
		end
	end
	return rec
end

-- lockedOut denies r while rec's lock-out lasts (backend.LockedOut).
local function lockedOut(rec, r)
	if rec.level > 0 and rec.untl > now then
		local wait = rec.untl - now
		r[KEY_REPLY_ALLOWED] = 0
		r[KEY_REPLY_REMAINING] = 0
		r[KEY_REPLY_RETRY] = wait
		r[KEY_REPLY_RESET] = wait
		r[KEY_REPLY_DELAY] = 0
		rec.locked = true
	end
	return r
end

-- lockOut locks rec's key out after its limit denied r, unless it is
-- locked out already or r can never pass (backend.Lockout.Escalate), and
-- reports whether it did.
local function lockOut(rec, r)
	if rec.locked or r[KEY_REPLY_ALLOWED] ~= 0 or r[KEY_REPLY_RETRY] == -1 then return false end
	local lo = rec.lo
	local level = 1
	if rec.level > 0 and now - rec.untl < lo.longest then
		level = rec.level + 1
		if level > #lo.steps then level = #lo.steps end
	end
	local untl = now + lo.steps[level]
	redis.call('SET', rec.key, abs(untl) .. ':' .. level, 'PX', px(untl + lo.longest))
	r[KEY_REPLY_REMAINING] = 0
	r[KEY_REPLY_RETRY] = untl - now
	r[KEY_REPLY_RESET] = r[KEY_REPLY_RETRY]
	r[KEY_REPLY_DELAY] = 0
	return true
end

