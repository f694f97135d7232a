------------------------------------------------------------------------
-- The call: what it does is its mode (ARGV[ARG_MODE], 00-protocol.lua).

-- MODE_MANY: each request is decided on its own, all or nothing over its
-- own keys, in the order given, as if each were a call of its own at the
-- same instant. After the header, each request is the number of its keys
-- (MANY_COUNT_ARGS) then their arguments; KEYS holds the requests' keys in
-- the same order. The reply is the clock, then per request its decision as
-- in MODE_DECIDE (without the clock), or an error message alone: a request
-- that fails (its arguments or its keys, read or decided) does not fail
-- the others.
if mode == MODE_MANY then
	-- Made here, not above: a function is made anew on every call.
	local function decideRequest(k0, o, n, out, at)
		decideKeys(readArgs(k0, o, n), false, out, at)
	end
	local out = {NS, NN} -- REPLY_NOW_SECONDS, REPLY_NOW_NANOS
	local k0, o = 0, HEADER_ARGS -- the keys and arguments before a request's
	local last = #ARGV
	while o < last do
		local n = tonumber(ARGV[o + MANY_COUNT_ARGS])
		local at = #out
		local ok, err = pcall(decideRequest, k0, o + MANY_COUNT_ARGS, n, out, at)
		if not ok then
			for j = #out, at + 1, -1 do out[j] = nil end
			if type(err) == 'table' then err = err.err end
			out[at + 1] = tostring(err)
		end
		k0 = k0 + n
		o = o + MANY_COUNT_ARGS + n * KEY_ARGS
	end
	return out
end

local args = readArgs(0, HEADER_ARGS, #KEYS)

-- SPEND BUDGETS: commit or release reservations.
if mode == MODE_COMMIT or mode == MODE_RELEASE then
	for i = 1, #args do settleOne(args[i], mode == MODE_RELEASE) end
	return {}
end

-- A refund gives back each key in turn (one key may be refunded twice in
-- one request), so each state is read just before its refund.
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
-- needs (the caller sends several slots' calls and may have to take this
-- one back). The admin script's modes decide too (lua/admin.lua).
local out = {NS, NN} -- REPLY_NOW_SECONDS, REPLY_NOW_NANOS
decideKeys(args, mode == MODE_DECIDE_UNDOABLE, out, REPLY_CLOCK_VALUES)
return out
