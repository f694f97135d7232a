------------------------------------------------------------------------
-- The call: what it does is its mode (ARGV[ARG_MODE], 00-protocol.lua).

-- packFormats holds struct.pack's format of n values, made once for each
-- n (at most REPLY_PACKED_CHUNK of them): string.rep would cost each call
-- a fifth of its packing.
local packFormats = {}
local function packFormat(n)
	local f = packFormats[n]
	if not f then
		f = REPLY_PACKED_ORDER .. string.rep(REPLY_PACKED_NUMBER, n)
		packFormats[n] = f
	end
	return f
end

-- packed is the reply out, numbers only, as one string: REPLY_PACKED_CHUNK
-- values at a time, each packed as REPLY_PACKED_NUMBER.
local function packed(out)
	local n = #out
	if n <= REPLY_PACKED_CHUNK then return struct.pack(packFormat(n), unpack(out)) end
	local parts = {}
	for i = 1, n, REPLY_PACKED_CHUNK do
		local j = math.min(i + REPLY_PACKED_CHUNK - 1, n)
		parts[#parts + 1] = struct.pack(packFormat(j - i + 1), unpack(out, i, j))
	end
	return table.concat(parts)
end

-- decideMany (MODE_MANY) decides each request on its own, all or nothing
-- over its own keys, in the order given, as if each were a call of its own
-- at the same instant. After the header come the zones (MANY_ZONES_ARGS,
-- then ZONE_ARGS per zone), then each request: its head (MANY_HEAD_ARGS,
-- read by head), then, unless the head stands for the whole request, its
-- MANY_KEY_ARGS per key; KEYS holds the requests' keys in the same order.
-- The reply is the clock, then per request its decision as in MODE_DECIDE
-- (without the clock), short if it is one (shorten), or an error message
-- alone: a request that fails (its arguments or its keys, read or
-- decided) does not fail the others. When none failed, the reply is
-- packed.
local function decideMany()
	local out = {NS, NN} -- REPLY_NOW_SECONDS, REPLY_NOW_NANOS
	local z0 = HEADER_ARGS + MANY_ZONES_ARGS -- the arguments before the zones'
	local zones = {} -- read when a key first names them
	local k0 = 0 -- the keys before the request's
	local o = z0 + tonumber(ARGV[HEADER_ARGS + MANY_ZONES_ARGS]) * ZONE_ARGS -- its arguments
	local last = #ARGV
	local mts = {} -- the zones as metatables of their keys' arguments
	local at -- the reply's values before the request's
	local function zoneAt(zi)
		local z = zones[zi]
		if not z then
			z = zoneArgs(z0 + (zi - 1) * ZONE_ARGS)
			zones[zi] = z
			mts[zi] = {__index = z}
		end
		return z
	end
	-- One pcall runs every request; after a request fails, a new one
	-- goes on from the next.
	local function decideFrom()
		while o < last do
			local hs = ARGV[o + MANY_HEAD_ARGS]
			local h = headOf[hs] or head(hs)
			local n, zi = h[1], h[3]
			at = #out
			-- The arguments, all of them before any key is read, in
			-- decidePlain's tables.
			if zi then
				zis[1], zs[1], costs[1], x1s[1], x2s[1] = zi, zones[zi] or zoneAt(zi), h[4], h[5], ''
			else
				for i = 1, n do
					local b = o + MANY_HEAD_ARGS + (i - 1) * MANY_KEY_ARGS
					local za, ca = ARGV[b + MANY_KEY_ZONE], ARGV[b + MANY_KEY_COST]
					za = numOf[za] or num(za)
					zis[i], zs[i], costs[i] = za, zones[za] or zoneAt(za), numOf[ca] or num(ca)
					x1s[i], x2s[i] = ARGV[b + MANY_KEY_X1], ARGV[b + MANY_KEY_X2]
				end
			end
			if not decidePlain(k0, n, out, at) then
				local args = {}
				for i = 1, n do
					args[i] = setmetatable({key = KEYS[k0 + i], cost = costs[i],
						x1 = x1s[i], x2 = x2s[i]}, mts[zis[i]])
				end
				decideKeys(args, false, out, at)
				if n == 1 then shorten(out, at, zs[1].p2) end
			end
			k0 = k0 + n
			o = o + h[2]
		end
	end
	local failed = false
	while true do
		local ok, err = pcall(decideFrom)
		if ok and failed then return out end
		if ok then return packed(out) end
		failed = true
		for j = #out, at + 1, -1 do out[j] = nil end
		if type(err) == 'table' then err = err.err end
		out[at + 1] = tostring(err)
		local hs = ARGV[o + MANY_HEAD_ARGS]
		local h = headOf[hs] or head(hs)
		k0 = k0 + h[1]
		o = o + h[2]
	end
end

-- call is one call of the script: keys and argv are its KEYS and ARGV.
local function call(keys, argv)
	KEYS, ARGV = keys, argv
	floor, max, sub = math.floor, math.max, string.sub
	mode = ARGV[ARG_MODE]
	local ns, extra = ARGV[ARG_NOW_SECONDS], ARGV[ARG_EXPIRY_EXTRA]
	if ns ~= CLOCK_SERVER then
		NS = numOf[ns] or num(ns)
		NN = tonumber(ARGV[ARG_NOW_NANOS])
	else
		local t = redis.call('TIME')
		ns = t[1]
		NS = numOf[ns] or num(ns)
		NN = tonumber(t[2]) * 1000
	end
	EXTRA = numOf[extra] or num(extra)
	now = NN
	-- What the parts remember within a call: some of it is relative to
	-- the call's clock, and none may grow from call to call.
	basemod, hists, metas, froms, lockoutSpecs = {}, {}, {}, {}, {}
	logPreKey, logPreRaw = nil, nil

	if mode == MODE_MANY then return decideMany() end

	local args = readArgs(0, HEADER_ARGS, #KEYS)

	-- SPEND BUDGETS: commit or release reservations.
	if mode == MODE_COMMIT or mode == MODE_RELEASE then
		for i = 1, #args do settleOne(args[i], mode == MODE_RELEASE) end
		return {}
	end

	-- A refund gives back each key in turn (one key may be refunded twice
	-- in one request), so each state is read just before its refund.
	if mode == MODE_REFUND then
		for i = 1, #args do refundOne(args[i]) end
		return {}
	end

	if mode == MODE_SETTLE then
		settleKeys(args)
		return {}
	end

	if mode == MODE_UNDO then
		undoKeys(args)
		return {}
	end

	-- MODE_DECIDE, or MODE_DECIDE_UNDOABLE: decide and reply what an undo
	-- needs (the caller sends several slots' calls and may have to take
	-- this one back). The admin script's modes decide too (lua/admin.lua).
	local out = {NS, NN} -- REPLY_NOW_SECONDS, REPLY_NOW_NANOS
	decideKeys(args, mode == MODE_DECIDE_UNDOABLE, out, REPLY_CLOCK_VALUES)
	return out
end
