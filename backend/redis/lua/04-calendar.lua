------------------------------------------------------------------------
-- CALENDAR WINDOWS (backend/redis/budget.go). A fixed window aligned to
-- the hours, days or months of a time zone comes with p1 written
-- "<W>@<b0>,<b1>,<b2>,<b3>": the boundaries of three consecutive windows
-- around the calling instance's clock, computed by Go (Lua has no time
-- zone rules). The script picks the one that holds its own TIME, so the
-- instances agree as long as their clocks are within a window of Redis's.

-- calArg reads such a p1 into a.p1 (W, the nominal length that the
-- policy history records) and a.cal (the boundaries, relative to now).
local function calArg(a, raw)
	local w, b0, b1, b2, b3 = string.match(raw, '^(%d+)@(%d+),(%d+),(%d+),(%d+)$')
	if not w then error('bad window argument ' .. raw) end
	a.p1 = tonumber(w)
	a.cal = {rel(b0), rel(b1), rel(b2), rel(b3)}
end

-- calStart is the start of the window that holds t.
local function calStart(cal, t)
	for i = 1, 3 do
		if cal[i] and cal[i + 1] and cal[i] <= t and t < cal[i + 1] then return cal[i] end
	end
	error('calendar window: the clock of Redis and of the Caddy that called differ by more than a window')
end

-- calEnd is the end of the window that starts at start (W after it for a
-- start Go did not send: a window long over, whose end matters little).
local function calEnd(cal, start, W)
	for i = 1, 3 do
		if cal[i] == start then return cal[i + 1] end
	end
	return start + W
end
-- END CALENDAR WINDOWS

