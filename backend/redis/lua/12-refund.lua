------------------------------------------------------------------------
-- Refunds (MODE_REFUND), and the refunds of the features that give back.

-- refundOne gives back what a granted decision took from the key of a.
local function refundOne(a)
	local key = a.key
	local s, exists = load(a.kind, key, a.param, a.p2, a.lin, a.gen, a.hist)
	-- A bucket's refund and settle add ":<when it was to be full again>".
	local x1, till = a.x1, nil
	local c = string.find(x1, ':', 1, true)
	if c then
		till = rel(sub(x1, c + 1))
		x1 = sub(x1, 1, c - 1)
	end
	local at = rel(x1) or -P53
	local k = a.kind
	if k == KIND_LOG then
		libL().refund(s, a.cost, at, key, a.p1)
	elseif exists then
		local r
		if k == KIND_BUCKET then
			r = libB().refund(s, a.p1, a.cost, till)
		elseif k == KIND_QUEUE then
			r = libB().qrefund(s, a.p1, a.cost, at, tonumber(a.x2))
		elseif k == KIND_WINDOW then
			r = libW().refund(s, a.p1, a.cost, at, a.cal)
		else
			r = libC().refund(s, a.p1, a.cost, at)
		end
		-- Nothing to give back leaves the key as it is (a state idle now
		-- is not idle for a clock that steps back).
		if r ~= s then store(k, key, r, a.param, a.lin, a.gen, a.p1, a.cal) end
	end
end

