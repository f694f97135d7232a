-- wrk script of bench/e2e.sh and bench/peers.sh: each connection walks
-- its own stride of 10,000 keys, one per request, in the X-Key header.
local n = 0
local counter = 0
setup = function(thread) counter = counter + 1; thread:set("id", counter) end
init = function() n = tonumber(wrk.thread:get("id") or 1) * 7919 end
request = function()
	n = n + 1
	return wrk.format(nil, nil, { ["X-Key"] = "k" .. (n % 10000) })
end
