------------------------------------------------------------------------

-- readArgs reads the arguments of n keys, KEYS[k0 + 1 .. k0 + n], from
-- ARGV[o0 + 1] on.
local function readArgs(k0, o0, n)
	local args = {}
	for i = 1, n do
		local o = o0 + (i - 1) * F
		args[i] = {
			key = KEYS[k0 + i],
			kind = ARGV[o + 1],
			p1 = tonumber(ARGV[o + 2]),
			p2 = tonumber(ARGV[o + 3]),
			cost = tonumber(ARGV[o + 4]),
			x1 = ARGV[o + 5],
			x2 = ARGV[o + 6],
			lin = ARGV[o + 7],
			gen = tonumber(ARGV[o + 8]),
			hist = ARGV[o + 9],
			from = ARGV[o + 10],
			lk = ARGV[o + 11],
		}
		local a = args[i]
		if not a.p1 then
			local t, r = string.match(ARGV[o + 2], '^(%d+)/(%d+)$')
			if t then
				a.p1, a.param = tonumber(t), tonumber(r)
			else
				calArg(a, ARGV[o + 2])
			end
		end
		a.param = a.param or a.p1
	end
	return args
end

