------------------------------------------------------------------------
-- UNDO (MODE_UNDO) takes back a decision (MODE_DECIDE_UNDOABLE) that other
-- calls of the same request (other Redis Cluster slots) denied: a key
-- nobody wrote since gets its value from before the decision back,
-- exactly; any other key (and every sliding log, whose refund is exact) is
-- refunded. After the KEY_ARGS arguments of each key come UNDO_VALUES
-- more per key: the value before, its expiry (ms), the value written.

local function undoKeys(args)
	local n = #args
	for i = 1, n do
		local a = args[i]
		-- A reserving decision's token (KEY_ARG_X2) starts with t.
		if sub(a.x2, 1, 1) == 't' then settleOne(a, false) end
		local o = HEADER_ARGS + n * KEY_ARGS + (i - 1) * UNDO_VALUES
		local old, ttl, new = ARGV[o + UNDO_BEFORE], tonumber(ARGV[o + UNDO_EXPIRY]), ARGV[o + UNDO_AFTER]
		if a.kind ~= KIND_LOG and new ~= '' and redis.call('GET', a.key) == new then
			if old == '' then
				redis.call('DEL', a.key)
			elseif ttl == -1 then
				redis.call('SET', a.key, old) -- it had no expiry (not ours)
			else
				if ttl < 1 then ttl = 1 end
				redis.call('SET', a.key, old, 'PX', ttl)
			end
		else
			refundOne(a)
		end
	end
end
