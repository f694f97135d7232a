------------------------------------------------------------------------
-- A key's arguments (KEY_ARG_KIND to KEY_ARG_LOCKOUT, 00-protocol.lua).

-- p1Arg reads a p1 that is not a number into a.p1 (and a.param): an
-- adjusted bucket's "T/R", or a calendar window's.
local function p1Arg(a, raw)
	local t, r = string.match(raw, '^(%d+)/(%d+)$')
	if t then
		a.p1, a.param = tonumber(t), tonumber(r)
	else
		calArg(a, raw)
	end
end

-- readArgs reads the arguments of n keys, KEYS[k0 + 1 .. k0 + n], from
-- ARGV[o0 + 1] on, KEY_ARGS per key.
local function readArgs(k0, o0, n)
	local args = {}
	for i = 1, n do
		local o = o0 + (i - 1) * KEY_ARGS
		local a = {
			key = KEYS[k0 + i],
			kind = ARGV[o + KEY_ARG_KIND],
			p1 = tonumber(ARGV[o + KEY_ARG_P1]),
			p2 = tonumber(ARGV[o + KEY_ARG_P2]),
			cost = tonumber(ARGV[o + KEY_ARG_COST]),
			x1 = ARGV[o + KEY_ARG_X1],
			x2 = ARGV[o + KEY_ARG_X2],
			lin = ARGV[o + KEY_ARG_LINEAGE],
			gen = tonumber(ARGV[o + KEY_ARG_GENERATION]),
			hist = ARGV[o + KEY_ARG_HISTORY],
			from = ARGV[o + KEY_ARG_FROM],
			lk = ARGV[o + KEY_ARG_LOCKOUT],
		}
		if not a.p1 then p1Arg(a, ARGV[o + KEY_ARG_P1]) end
		a.param = a.param or a.p1
		args[i] = a
	end
	return args
end

-- zoneArgs reads the zone at ARGV[o + 1] on (MODE_MANY, ZONE_ARGS
-- arguments), once per call: the table a key's arguments read the rest
-- from (their metatable's __index) once they hold what is their own (key,
-- cost, x1, x2, and what a decision changes). A zone of buckets or of
-- fixed windows (not calendar ones) without a change of kind or lock-outs
-- gets meta, the suffix of its keys' values, and a zone of sliding logs
-- without them plainLog: decidePlain (14-decide.lua) decides its keys.
local function zoneArgs(o)
	local p1, p2, gen = ARGV[o + ZONE_ARG_P1], ARGV[o + ZONE_ARG_P2], ARGV[o + ZONE_ARG_GENERATION]
	local z = {
		kind = ARGV[o + ZONE_ARG_KIND],
		p1 = numOf[p1] or num(p1),
		p2 = numOf[p2] or num(p2),
		lin = ARGV[o + ZONE_ARG_LINEAGE],
		gen = numOf[gen] or num(gen),
		hist = ARGV[o + ZONE_ARG_HISTORY],
		from = ARGV[o + ZONE_ARG_FROM],
		lk = ARGV[o + ZONE_ARG_LOCKOUT],
	}
	if not z.p1 then p1Arg(z, ARGV[o + ZONE_ARG_P1]) end
	z.param = z.param or z.p1
	if (z.kind == KIND_BUCKET or z.kind == KIND_WINDOW and not z.cal) and z.from == '' and z.lk == '' then
		z.meta = metaOf(z.param, z.lin, z.gen)
	end
	z.plainLog = z.kind == KIND_LOG and z.from == '' and z.lk == ''
	return z
end

-- head reads the head of a request of MODE_MANY (MANY_HEAD_ARGS): its
-- number of keys n and of arguments, head included; for a head that
-- stands for a request of one key, also the place of its zone, its cost
-- and its x1. headOf[s] or head(s) is head(s): the table is the same
-- for every request with that head, and read-only.
local function head(s)
	local h
	local zi, x1, cost = string.match(s, '^(%d+)(%a)(%d+)$')
	if zi then
		if x1 == MANY_HEAD_COUNTED then
			x1 = DECIDE_COUNTED
		elseif x1 == MANY_HEAD_SHADOW then
			x1 = DECIDE_SHADOW
		else
			error('bad request head ' .. s)
		end
		h = {1, MANY_HEAD_ARGS, tonumber(zi), tonumber(cost), x1}
	else
		local n = tonumber(s)
		if not n then error('bad request head ' .. s) end
		h = {n, MANY_HEAD_ARGS + n * MANY_KEY_ARGS}
	end
	memoRoom()
	headOf[s] = h
	return h
end
