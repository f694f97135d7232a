------------------------------------------------------------------------
-- A key's arguments (KEY_ARG_KIND to KEY_ARG_LOCKOUT, 00-protocol.lua).

-- readArgs reads the arguments of n keys, KEYS[k0 + 1 .. k0 + n], from
-- ARGV[o0 + 1] on, KEY_ARGS per key.
local function readArgs(k0, o0, n)
	local args = {}
	for i = 1, n do
		local o = o0 + (i - 1) * KEY_ARGS
		args[i] = {
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
		local a = args[i]
		if not a.p1 then
			-- An adjusted bucket's "T/R", or a calendar window's.
			local t, r = string.match(ARGV[o + KEY_ARG_P1], '^(%d+)/(%d+)$')
			if t then
				a.p1, a.param = tonumber(t), tonumber(r)
			else
				calArg(a, ARGV[o + KEY_ARG_P1])
			end
		end
		a.param = a.param or a.p1
	end
	return args
end

