------------------------------------------------------------------------
-- Sliding log: one string. A header ('<ddBBI4I4', 26 bytes): the base
-- second, the units the live events hold, the format, a byte older
-- versions set when some events were given back, the number of events
-- pruned (they stay in the string until it is compacted) and the number of
-- events. Then the events, oldest first, each with its time in ns after the
-- base second (double).
--   Format 0, every event one unit: the time alone (8 bytes). A denied
--   request's retry time is the time of the need-th live event: one read.
--   Format 2, units that vary or an event given back: the time (an event
--   given back is marked by writing -time-1), its units (uint32) and the
--   node of a Fenwick tree over the units of events 1..n (double: the units
--   of events i-lowbit(i)+1..i, given-back ones counting 0). The event at
--   which enough units leave the window is found by descending the tree,
--   and an event is given back by updating the nodes above it: O(log n)
--   reads and writes however the costs were chosen, where walking the
--   events one by one let a client who chooses costs (many tiny events,
--   then a large one) make every denied call read the whole log.
--   Format 1 (units per event, found by walking) is only read, from logs
--   older versions wrote: they are rewritten in format 2 when loaded.
--   A log of format 0 may have room (tombs byte 1, which older versions
--   read as one of their logs with events given back, and rewrite in
--   format 2 from events h+1..n): its first META slots (counted as
--   pruned) hold MAGIC and the slots the string holds (cap, '<I4I4'),
--   the newest event's offset and the offset its key's expiry covers
--   (doubles); then the events; then zeroed slots up to cap.
-- A decision reads the header with the first PRE bytes of events, all of
-- a small log, and the few other events it needs (GETRANGE); a request of
-- one key and a cost of 1 reads the header with WIN slots (logPlainOne).
-- It logs an event in a log of under ROOM_FROM live events by writing it
-- whole (SET ... PX). From ROOM_FROM live events on, a log is written
-- with room, and an event is logged in place: the event past the last one
-- and the header with its meta (SETRANGE), the expiry only when it no
-- longer covers the event's window. Redis's Lua hashes every string it
-- makes, byte by byte (about 12 instructions a byte): a log written whole
-- costs three strings its size a decision, a log with room none. The
-- string is rewritten (roomWrite) when its room is used up, or its first
-- live event is past the slots read with the header (a log of up to
-- SCAN_MOST live events), or its pruned events outnumber its live ones:
-- amortized O(1) per event logged.

local Llib
-- What the batched call read of a log it left to decideKeys (logPreKey's
-- first PRE bytes of events, logPreRaw), for logLoad to use: nothing was
-- written between. Redis's Lua hashes every string whole, so each KB read
-- costs about 12k instructions.
local logPreKey, logPreRaw
local function libL()
	if Llib then return Llib end
	local HDR = 26
	local CH = 32 -- events per read
	local PRE = 1024 -- bytes of events read with the header
	local PLAIN = 4096 -- bytes of events of a log decidePlain reads whole, at most
	local STRIDE = {[0] = 8, [1] = 12, [2] = 20}
	local MAGIC = 1380994131 -- a log with room: its first meta slot
	local META = 3 -- meta slots
	local FENMAX = 140737488355328 -- 2^47
	-- Numbers reach redis.call as decimal strings written here: Redis
	-- writes a Lua number with "%.17g", a few thousand instructions each,
	-- more than a decision's arithmetic.
	local function dec(x) return string.format('%d', x) end
	local PRE_END = dec(HDR + PRE - 1)
	local PAST_PRE = dec(HDR + PRE)
	-- pxs is px(idle) written for redis.call.
	local function pxs(idle) return dec(px(idle)) end
	-- pxsWindow is pxs(now + W), the expiry of a log whose newest event is
	-- now: the same for every decision of a zone with the same EXTRA, so it
	-- is written once (string.format costs more than the rest of a small
	-- log's write). One entry per window length: bounded by the zones.
	local pxsOf, pxsExtra = {}, {}
	local function pxsWindow(W)
		if pxsExtra[W] ~= EXTRA then
			pxsOf[W], pxsExtra[W] = pxs(now + W), EXTRA
		end
		return pxsOf[W]
	end

	local function lowbit(i)
		local b = 1
		while i % (b + b) == 0 do b = b + b end
		return b
	end

	local ROOM_FROM = 32 -- live events from which a log is written with room
	local WIN = 24 -- slots a single-key decision reads with the header
	local WIN_END = dec(HDR + WIN * 8 - 1)
	-- Up to SCAN_MOST live events, a log whose first live event is past
	-- the slots read with the header is rewritten (a few KB); a longer
	-- one has its next slots read, CH at a time, and is rewritten when
	-- its pruned events outnumber its live ones (amortized O(1) per event).
	local SCAN_MOST = 128
	local zerosOf = {}
	local function zeros(k)
		local z = zerosOf[k]
		if not z then
			z = string.rep('\0', k * 8)
			-- (A Function's tables outlive the call: only the sizes of
			-- short logs' room are kept.)
			if k <= 64 then zerosOf[k] = z end
		end
		return z
	end
	local function offs(x)
		return strOf[x] or str(x)
	end
	-- roomWrite writes the log of base second d whose live events are evs
	-- (live of them, oldest first) and the event t: with room, or whole
	-- without once under half of ROOM_FROM (between the two a log keeps
	-- the form it has, so that one at the edge is not rewritten at every
	-- event).
	local function roomWrite(key, W, d, evs, live, t)
		local b = d * E9
		if live + 1 < ROOM_FROM / 2 then
			local ms
			if t == now then ms = pxsWindow(W) else ms = pxs(t + W) end
			redis.call('SET', key, struct.pack('<ddBBI4I4', NS + d, live + 1, 0, 0, 0, live + 1) .. evs .. struct.pack('<d', t - b), 'PX', ms)
			return
		end
		local n = META + live + 1
		-- Room for live/8 events (at least 16: a rewrite costs about 35
		-- instructions a byte), and as many more as the string's
		-- allocation holds anyway: Redis allocates a string's bytes (with
		-- a header of 3 or 5 bytes and a NUL) from jemalloc's size
		-- classes, four per doubling past 128 bytes.
		local r = floor(live / 8)
		if r < 16 then r = 16 end
		local size = HDR + (n + r) * 8 + 6
		local p = 128
		while p * 2 < size do p = p * 2 end
		local q = p / 4
		local cap = floor((p + floor((size - p + q - 1) / q) * q - 6 - HDR) / 8)
		local exp = t + W + floor(W / 16)
		redis.call('SET', key, struct.pack('<ddBBI4I4I4I4dd', NS + d, live + 1, 0, 1, META, n, MAGIC, cap, t - b, exp - b) ..
			evs .. struct.pack('<d', t - b) .. zeros(cap - n), 'PX', pxs(exp))
	end
	-- roomAppend logs the event t in a room log (base b, its second d)
	-- that has room for it, in place: the event past the last one, then
	-- the header and meta; its expiry is set again only when t + W passes
	-- the one it has, to W/16 later.
	local function roomAppend(key, W, b, d, h, n, cap, expOff, units, t)
		redis.call('SETRANGE', key, offs(HDR + n * 8), struct.pack('<d', t - b))
		local e = b + expOff
		if t + W > e then
			e = t + W + floor(W / 16)
			redis.call('PEXPIRE', key, pxs(e))
		end
		redis.call('SETRANGE', key, '0', struct.pack('<ddBBI4I4I4I4dd', NS + d, units + 1, 0, 1, h, n + 1, MAGIC, cap, t - b, e - b))
	end
	-- roomFull tells a room log is rewritten to log an event: no room
	-- left, or its first live event (pruned head h) past the slots read
	-- with the header.
	local function roomFull(h, n, cap)
		if n + 1 > cap then return true end
		if n - h <= SCAN_MOST then
			local k = h + 1
			if k > n then k = n end
			return cap > WIN and k > WIN
		end
		return h - META > n - h
	end

	-- logEvent returns event i's time and units (0: given back).
	local function logEvent(l, i)
		local s, pos
		local at = HDR + (i - 1) * l.stride
		if at + l.stride <= #l.pre then
			s, pos = l.pre, at + 1
		else
			local c = floor((i - 1) / CH)
			local chunks = l.chunks
			if not chunks then
				chunks = {}
				l.chunks = chunks
			end
			s = chunks[c]
			if not s then
				local from = HDR + c * CH * l.stride
				s = redis.call('GETRANGE', l.key, dec(from), dec(from + CH * l.stride - 1))
				chunks[c] = s
			end
			pos = (i - 1 - c * CH) * l.stride + 1
		end
		local off = struct.unpack('<d', s, pos)
		local u = 1
		if l.wide ~= 0 then u = struct.unpack('<I4', s, pos + 8) end
		if off < 0 then return l.base - off - 1, 0 end
		return l.base + off, u
	end

	-- logFen reads node i of a format-2 log's tree, through the chunks
	-- already read, or on its own (a descent touches one node per chunk).
	local function logFen(l, i)
		local fens = l.fens
		if not fens then
			fens = {}
			l.fens = fens
		end
		local v = fens[i]
		if v then return v end
		local c = floor((i - 1) / CH)
		local s = l.chunks and l.chunks[c]
		local at = HDR + (i - 1) * 20 + 12
		if at + 8 <= #l.pre then
			v = struct.unpack('<d', l.pre, at + 1)
		elseif s then
			v = struct.unpack('<d', s, (i - 1 - c * CH) * 20 + 13)
		else
			local from = HDR + (i - 1) * 20 + 12
			v = struct.unpack('<d', redis.call('GETRANGE', l.key, dec(from), dec(from + 7)))
		end
		fens[i] = v
		return v
	end

	-- logFenSub takes units out of event i in the tree: the nodes above it.
	local function logFenSub(l, key, i, units)
		while i <= l.n do
			local f = logFen(l, i) - units
			l.fens[i] = f
			redis.call('SETRANGE', key, dec(HDR + (i - 1) * 20 + 12), struct.pack('<d', f))
			i = i + lowbit(i)
		end
	end

	-- logPrefix is the units of events 1..i, given-back ones counting 0.
	local function logPrefix(l, i)
		local s = 0
		while i > 0 do
			s = s + logFen(l, i)
			i = i - lowbit(i)
		end
		return s
	end

	-- logSearch is the first event i (of 1..n) with logPrefix(i) >= target;
	-- the nodes are never negative, so the tree can be descended.
	local function logSearch(l, target)
		local pos, step = 0, 1
		while step * 2 <= l.n do step = step * 2 end
		while step >= 1 do
			local j = pos + step
			if j <= l.n then
				local f = logFen(l, j)
				if f < target then
					pos = j
					target = target - f
				end
			end
			step = step / 2
		end
		return pos + 1
	end

	local function logHeader(l)
		local tombs = 0
		if l.room then tombs = 1 end
		return struct.pack('<ddBBI4I4', NS + l.base / E9, l.sum, l.wide, tombs, l.h, l.n)
	end

	-- logRewrite writes the live events of l, and the event (t, u) when t
	-- is given, as a new string in format fmt whose base is the second of
	-- its oldest event, and returns it loaded; nil (the key deleted) when
	-- no event is left. With ms (pxs), the string is written with that
	-- expiry.
	local function logRewrite(l, fmt, t, u, ms)
		local times, units = {}, {}
		local sum = 0
		local base
		if l.n then
			for i = l.h + 1, l.n do
				local at, k = logEvent(l, i)
				if k > 0 then
					if not base then base = floor(at / E9) * E9 end
					times[#times + 1] = at
					units[#units + 1] = k
					sum = sum + k
				end
			end
		end
		if t then
			if not base then base = floor(t / E9) * E9 end
			times[#times + 1] = t
			units[#units + 1] = u
			sum = sum + u
		end
		local m = #times
		if m == 0 then
			redis.call('DEL', l.key)
			return nil
		end
		local parts = {}
		if fmt == 2 then
			local fen = {}
			for i = 1, m do fen[i] = units[i] end
			for i = 1, m do
				local j = i + lowbit(i)
				if j <= m then fen[j] = fen[j] + fen[i] end
			end
			for i = 1, m do parts[i] = struct.pack('<dI4d', times[i] - base, units[i], fen[i]) end
		else
			for i = 1, m do parts[i] = struct.pack('<d', times[i] - base) end
		end
		local nl = {key = l.key, base = base, sum = sum, wide = fmt, h = 0, h0 = 0, n = m,
			stride = STRIDE[fmt], pre = ''}
		if ms then
			redis.call('SET', l.key, logHeader(nl) .. table.concat(parts), 'PX', ms)
		else
			redis.call('SET', l.key, logHeader(nl) .. table.concat(parts))
		end
		return nl
	end

	-- logReform is logRewrite(l, fmt) keeping the key's expiry, which a
	-- SET without one would drop: a refund, a settle or a grant that
	-- rewrites a log and then writes only its header in place must not
	-- leave a key that never expires.
	local function logReform(l, fmt)
		local ttl = redis.call('PTTL', l.key)
		local ms
		if ttl > 0 then ms = dec(ttl) end
		return logRewrite(l, fmt, nil, nil, ms)
	end

	-- logLoad reads key's header: nil when there is no log (or only one
	-- so old that every event has left every window).
	local function logLoad(key)
		local hdr
		if key == logPreKey then
			hdr = logPreRaw
			logPreKey, logPreRaw = nil, nil
		else
			hdr = redis.call('GETRANGE', key, '0', PRE_END)
		end
		if #hdr < HDR then
			if sub(hdr, 1, 1) == 'm' then return nil, redis.call('GET', key) end -- a forwarding mark (09-kinds.lua)
			return nil
		end
		local base, sum, wide, tombs, head, n = struct.unpack('<ddBBI4I4', hdr)
		local d = base - NS
		if d < -FAR or d > FAR then return nil end
		-- (Its chunks and tree nodes are read when first needed.)
		local l = {key = key, base = d * E9, sum = sum, wide = wide,
			h = head, h0 = head, n = n, stride = STRIDE[wide], pre = hdr}
		-- The whole string when it is shorter than what was asked.
		if #hdr < HDR + PRE then l.whole = hdr end
		if wide == 0 and tombs == 1 and #hdr >= HDR + 24 and struct.unpack('<I4', hdr, HDR + 1) == MAGIC then
			local cap, newOff, expOff = struct.unpack('<I4dd', hdr, HDR + 5)
			if head >= META and n >= head and cap >= n then
				l.sum, l.room = n - head, {cap = cap, newest = newOff, exp = expOff}
				return l
			end
		end
		if wide == 1 or (wide == 0 and tombs == 1) then
			-- An older version's log, whose retry time was found by walking.
			-- The rewrite keeps its expiry: a denied decision that follows
			-- writes the header alone.
			return logReform(l, 2)
		end
		return l
	end

	-- logNewest is the time of the newest event not given back, or nil
	-- (a format-2 log keeps its last event live: O(1)).
	local function logNewest(l)
		-- (A room log keeps its newest event's time in its meta.)
		if l.room then
			if l.n > l.h then return l.base + l.room.newest end
			return nil
		end
		for i = l.n, l.h + 1, -1 do
			local t, u = logEvent(l, i)
			if u > 0 then return t end
		end
		return nil
	end

	-- logPrune drops (logically) the events with at + W <= now, and the
	-- events given back at the head. Each event is pruned once: amortized
	-- O(1) per event logged.
	local function logPrune(l, W)
		while l.h < l.n do
			local t, u = logEvent(l, l.h + 1)
			if u > 0 and t + W > now then break end
			l.sum = l.sum - u
			l.h = l.h + 1
		end
	end

	-- pruneWhole prunes a log of format 0 read whole (str, its base in ns
	-- from NS, head h, n events, sum units; or str its first bytes and rest
	-- the others) at W, reading its events without a table per event: the
	-- head and the units once pruned, and the newest event's time (nil:
	-- none), as logPrune and logNewest.
	local function pruneWhole(str, base, h, n, sum, W, rest)
		local m = #str
		while h < n do
			local off
			local at = HDR + h * 8
			if at < m then off = struct.unpack('<d', str, at + 1) else off = struct.unpack('<d', rest, at - m + 1) end
			-- (not off < 0: an offset that is not a number is a live
			-- event to logEvent, pruned, and the newest if last.)
			if not (off < 0) then
				if base + off + W > now then break end
				sum = sum - 1
			end
			h = h + 1
		end
		for i = n, h + 1, -1 do
			local off
			local at = HDR + (i - 1) * 8
			if at < m then off = struct.unpack('<d', str, at + 1) else off = struct.unpack('<d', rest, at - m + 1) end
			if not (off < 0) then return h, sum, base + off end
		end
		return h, sum
	end

	local function logDecide(l, W, limit, cost)
		local count = 0
		local reset = 0
		if l.n then
			local t
			if l.wide == 0 and l.whole and not l.room then
				-- A small log of single units in hand: logPrune and
				-- logNewest without a call per event (as logEvent reads
				-- them).
				l.h, l.sum, t = pruneWhole(l.whole, l.base, l.h, l.n, l.sum, W)
			else
				-- (A log with room is pruned from its head, as roomOne
				-- prunes it, and keeps its newest event's time in its
				-- meta.)
				logPrune(l, W)
				t = logNewest(l)
			end
			count = l.sum
			if t and t + W > now then reset = t + W - now end
			-- The take that follows an allowed decision prunes nothing
			-- more and finds the same newest event.
			l.pruned, l.newest = W, t
		end
		local r, done = counted(limit, count, cost, reset)
		if done then
			if r[KEY_REPLY_ALLOWED] == 1 and cost > 0 and r[KEY_REPLY_RESET] < W then r[KEY_REPLY_RESET] = W end
			return r
		end
		-- Wait until enough of the oldest units leave: need <= count, as a
		-- cost above the limit is done above.
		local need = count + cost - limit
		local i = l.h + need
		if l.wide == 2 then i = logSearch(l, logPrefix(l, l.h) + need) end
		r[KEY_REPLY_RETRY] = logEvent(l, i) + W - now
		return r
	end

	-- logTake logs cost units at now (at the newest event's time if the
	-- clock stepped back) and returns that time.
	local function logTake(l, W, cost, key)
		local t = now
		if not l.n then
			l = {key = key, pre = ''}
		else
			local newest = l.newest
			if l.pruned ~= W then
				logPrune(l, W)
				newest = logNewest(l)
			end
			if newest and newest > t then t = newest end
		end
		local fmt = l.wide or 0
		if cost ~= 1 then fmt = 2 end
		local live = (l.n or 0) - (l.h or 0)
		local fits = l.n and fmt == l.wide and t - l.base < P52
		local rec
		if fits and fmt == 0 and (l.room or live + 1 >= ROOM_FROM) then
			local d = l.base / E9
			if l.room and not roomFull(l.h, l.n, l.room.cap) then
				roomAppend(key, W, l.base, d, l.h, l.n, l.room.cap, l.room.exp, live, t)
				return t
			end
			local evs = ''
			if live > 0 and l.whole then
				evs = sub(l.whole, HDR + l.h * 8 + 1, HDR + l.n * 8)
			elseif live > 0 then
				evs = redis.call('GETRANGE', key, dec(HDR + l.h * 8), dec(HDR + l.n * 8 - 1))
			end
			roomWrite(key, W, d, evs, live, t)
			return t
		elseif fits and fmt == 0 then
			-- A short log is copied whole, without its pruned events: a
			-- string appended to grows its allocation ahead of use.
			local tail
			if l.whole then
				tail = sub(l.whole, HDR + l.h * 8 + 1)
			else
				tail = redis.call('GETRANGE', key, dec(HDR + l.h * 8), '-1')
			end
			local ms
			if t == now then ms = pxsWindow(W) else ms = pxs(t + W) end
			-- The header, the events and the new one in one pack (c0: the
			-- whole string tail), as logHeader writes the header.
			redis.call('SET', key, struct.pack('<ddBBI4I4c0d', NS + l.base / E9, l.sum + cost, l.wide, 0, 0, live + 1,
				tail, t - l.base), 'PX', ms)
			return t
		elseif fits and l.h <= live and fmt == 2 then
			-- Node i holds event i and the nodes below it that it covers.
			local i = l.n + 1
			local f = cost
			local j, stop = i - 1, i - lowbit(i)
			while j > stop do
				f = f + logFen(l, j)
				j = j - lowbit(j)
			end
			-- Nodes of at most 2^47 keep every prefix sum (at most 32
			-- nodes) exact; a rewrite makes the nodes cover the live
			-- events alone, at most the limit (below 2^32).
			if f <= FENMAX then rec = struct.pack('<dI4d', t - l.base, cost, f) end
		end
		if rec then
			-- Written at its place, not appended: a format-2 string may
			-- hold given-back events past the last one.
			redis.call('SETRANGE', key, dec(HDR + l.n * l.stride), rec)
			l.sum = l.sum + cost
			l.n = l.n + 1
			redis.call('SETRANGE', key, '0', logHeader(l))
			redis.call('PEXPIRE', key, pxs(t + W))
		else
			logRewrite(l, fmt, t, cost, pxs(t + W))
		end
		return t
	end

	-- logKeep writes back what a decision pruned without taking: the memory
	-- store's log drops those events, and a later, longer window must not
	-- see them again.
	local function logKeep(l, key)
		if not l.n or l.h == l.h0 then return end
		if not logNewest(l) then
			redis.call('DEL', key)
			return
		end
		redis.call('SETRANGE', key, '0', logHeader(l))
	end

	-- logFind is the newest live event of cost units logged at time at
	-- (refunds and settles). Times never decrease along a format-2 log (an
	-- event is logged at or after the last one, which is live), so it is
	-- found by bisection.
	local function logFind(l, cost, at)
		local lo, hi = l.h + 1, l.n
		if lo > hi or logEvent(l, lo) > at then return nil end
		while lo < hi do
			local mid = floor((lo + hi + 1) / 2)
			if logEvent(l, mid) <= at then lo = mid else hi = mid - 1 end
		end
		for i = lo, l.h + 1, -1 do
			local t, u = logEvent(l, i)
			if t < at then return nil end
			if u == cost then return i end
		end
		return nil
	end

	-- logRefund gives back the event the granted decision logged: cost
	-- units at time at, the newest such event; events of other requests
	-- are never touched.
	local function logRefund(l, cost, at, key, W)
		if not l.n or cost <= 0 then return end
		-- Events that left the window go first, as in a decision, and
		-- stay gone (logKeep) even when the event is not found.
		logPrune(l, W)
		if l.wide ~= 2 then
			l = logReform(l, 2)
			if not l then return end
		end
		local i = logFind(l, cost, at)
		if not i then
			logKeep(l, key)
			return
		end
		local t = logEvent(l, i)
		l.sum = l.sum - cost
		if i == l.n then
			-- The last event goes, and the given-back ones before it:
			-- the last event stays live.
			l.n = i - 1
			while l.n > l.h and select(2, logEvent(l, l.n)) == 0 do l.n = l.n - 1 end
		else
			redis.call('SETRANGE', key, dec(HDR + (i - 1) * 20), struct.pack('<d', -(t - l.base) - 1))
			logFenSub(l, key, i, cost)
		end
		l.chunks, l.pre = nil, ''
		if l.n == l.h then
			redis.call('DEL', key)
			return
		end
		redis.call('SETRANGE', key, '0', logHeader(l))
		redis.call('PEXPIRE', key, pxs(logNewest(l) + W))
	end
	-- logGrant gives back the newest live units (an operator's grant,
	-- algorithms.SlidingLog.Grant): events given back whole are cut off
	-- the end, and an event holding more units than are left to give
	-- keeps the rest. Giving back every live unit deletes the log.
	local function logGrant(l, units, key, W)
		if not l.n then return end
		logPrune(l, W)
		if units >= l.sum then
			redis.call('DEL', key)
			return
		end
		if l.room then l = logReform(l, 0) end
		if l.wide == 0 then
			-- Events of one unit: the newest units events go.
			l.n = l.n - units
			l.sum = l.sum - units
			redis.call('SET', key, logHeader(l) .. redis.call('GETRANGE', key, dec(HDR), dec(HDR + l.n * 8 - 1)))
		else
			while units > 0 do
				local t, u = logEvent(l, l.n)
				if u > units then
					local pos = HDR + (l.n - 1) * 20
					redis.call('SETRANGE', key, dec(pos + 8), struct.pack('<I4', u - units))
					logFenSub(l, key, l.n, units)
					l.sum = l.sum - units
					units = 0
				else
					-- The last event is live (given-back ones are cut off
					-- with it): cut it and those before it.
					l.sum = l.sum - u
					units = units - u
					l.n = l.n - 1
					while l.n > l.h and select(2, logEvent(l, l.n)) == 0 do l.n = l.n - 1 end
				end
			end
			redis.call('SETRANGE', key, '0', logHeader(l))
		end
		l.chunks, l.pre = nil, ''
		redis.call('PEXPIRE', key, pxs(logNewest(l) + W))
	end

	-- SETTLE (sliding log): algorithms.SlidingLog.Settle, for settle.go.
	-- logSettle rewrites the units of the event a granted decision logged
	-- (est units at time at) to act, giving it back at 0; when the event
	-- has left the window, the extra is logged now. The log holds at most
	-- 2^32 - 1 units.
	local function logSettle(l, est, act, at, key, W)
		if act == est then return end
		local room = 4294967295
		if l.n then
			-- Pruned for good, as the memory store's log is.
			logPrune(l, W)
			logKeep(l, key)
			l.h0 = l.h
			if not logNewest(l) then l = {} end
		end
		if l.n then room = max(room - l.sum, 0) end
		if act == 0 then
			logRefund(l, est, at, key, W)
			return
		end
		local i
		if l.n and est > 0 then
			if l.wide ~= 2 then l = logReform(l, 2) or {} end
			if l.n then i = logFind(l, est, at) end
		end
		if not i then
			local extra = act - est
			if extra > room then extra = room end
			if extra > 0 then logTake(l, W, extra, key) end
			return
		end
		local u = act
		if u > est + room then u = est + room end
		if u == est then return end
		redis.call('SETRANGE', key, dec(HDR + (i - 1) * 20 + 8), struct.pack('<I4', u))
		logFenSub(l, key, i, est - u)
		l.sum = l.sum + u - est
		redis.call('SETRANGE', key, '0', logHeader(l))
		l.chunks, l.pre = nil, ''
		-- Nodes past 2^47 would make prefix sums inexact: a rewrite makes
		-- them cover the live events alone.
		local j = i
		while j <= l.n do
			if l.fens[j] > FENMAX then
				l = logRewrite(l, 2)
				redis.call('PEXPIRE', key, pxs(logNewest(l) + W))
				return
			end
			j = j + lowbit(j)
		end
	end
	-- END SETTLE (sliding log)

	-- PLAIN LOGS: decidePlain (14-decide.lua) decides the logs of format 0
	-- small enough to be read whole (those logDecide reads whole), as
	-- logLoad, logDecide, logTake and logKeep would, without their tables;
	-- a log it leaves to them is not read twice (logPreKey).
	-- plainHeader reads the header of raw, a log read whole (m bytes; the
	-- first PRE bytes of its events in raw): its base second (from NS),
	-- stored head, events and units for a log of format 0 of up to PLAIN
	-- bytes of events whose header matches them, else nil.
	local function plainHeader(raw, m)
		if m < HDR or m >= HDR + PLAIN then return nil end
		local base, sum, wide, tombs, h0, n = struct.unpack('<ddBBI4I4', raw)
		local d = base - NS
		if wide ~= 0 or tombs ~= 0 or d < -FAR or d > FAR or m ~= HDR + n * 8 or h0 > n or sum ~= n - h0 then
			return nil
		end
		return d, h0, n, sum
	end
	-- logPlainRead reads key's log pruned at W: false when decideKeys must
	-- decide it (another format, a log read in parts, a forwarding mark, a
	-- base out of range, a header that does not match its events); else
	-- true, then nothing for no log, or the string, its base second (from
	-- NS), the head it was stored with, the head and the units once pruned,
	-- the number of events and the newest live event's time (or nil).
	local function logPlainRead(key, W)
		local raw = redis.call('GETRANGE', key, '0', PRE_END)
		local m = #raw
		if m == 0 then return true end
		local d, h0, n, sum
		if m < HDR + PRE then d, h0, n, sum = plainHeader(raw, m) end
		if not d then
			logPreKey, logPreRaw = key, raw
			return false
		end
		local h, units, newest = pruneWhole(raw, d * E9, h0, n, sum, W)
		return true, raw, d, h0, h, units, n, newest
	end
	-- logPlainEvent is event i's time (logEvent), of raw, or past raw in
	-- rest.
	local function logPlainEvent(raw, d, i, rest)
		local off
		local at = HDR + (i - 1) * 8
		if at < #raw then off = struct.unpack('<d', raw, at + 1) else off = struct.unpack('<d', rest, at - #raw + 1) end
		if off < 0 then return d * E9 - off - 1 end
		return d * E9 + off
	end
	-- logPlainTake logs a unit at t, as logTake does in a log it copies
	-- whole (raw, and rest after it), or as logRewrite starts one (raw nil).
	local function logPlainTake(key, W, t, raw, d, h, sum, n, rest)
		local ms
		if t == now then ms = pxsWindow(W) else ms = pxs(t + W) end
		if not raw then
			local b = floor(t / E9)
			redis.call('SET', key, struct.pack('<ddBBI4I4d', NS + b, 1, 0, 0, 0, 1, t - b * E9), 'PX', ms)
			return
		end
		local at = HDR + h * 8
		if sum + 1 >= ROOM_FROM then
			local evs
			if rest and at >= #raw then
				evs = sub(rest, at - #raw + 1)
			elseif rest then
				evs = sub(raw, at + 1) .. rest
			else
				evs = sub(raw, at + 1)
			end
			roomWrite(key, W, d, evs, sum, t)
			return
		end
		local hdr, ev = struct.pack('<ddBBI4I4', NS + d, sum + 1, 0, 0, 0, n - h + 1), struct.pack('<d', t - d * E9)
		if rest and at >= #raw then
			redis.call('SET', key, hdr .. sub(rest, at - #raw + 1) .. ev, 'PX', ms)
		elseif rest then
			redis.call('SET', key, hdr .. sub(raw, at + 1) .. rest .. ev, 'PX', ms)
		else
			-- (One concatenation: struct.pack's c0 copies a byte at a time.)
			redis.call('SET', key, hdr .. sub(raw, at + 1) .. ev, 'PX', ms)
		end
	end
	-- logPlainKeep is logKeep.
	local function logPlainKeep(key, d, h0, h, sum, n, newest)
		if h == h0 then return end
		if not newest then
			redis.call('DEL', key)
			return
		end
		redis.call('SETRANGE', key, '0', struct.pack('<ddBBI4I4', NS + d, sum, 0, 0, h, n))
	end
	-- roomOne is logPlainOne for a log with room (raw, its first m bytes,
	-- the header and up to WIN slots), as logLoad, logDecide, logTake and
	-- logKeep decide it: false, having written nothing, for decideKeys.
	local function roomOne(key, W, limit, raw, m)
		local base, _, wide, tombs, h0, n, _, cap, newOff, expOff = struct.unpack('<ddBBI4I4I4I4dd', raw)
		local d = base - NS
		if wide ~= 0 or tombs ~= 1 or d < -FAR or d > FAR or h0 < META or n < h0 or cap < n or
			m ~= HDR + WIN * 8 and m ~= HDR + cap * 8 then
			return false
		end
		local b = d * E9
		local h = h0
		-- part: slots from + 1 on, read past raw, CH at a time.
		local part, from
		while h < n do
			local at = HDR + h * 8
			local off
			if at + 8 <= m then
				off = struct.unpack('<d', raw, at + 1)
			else
				if not part or h >= from + CH then
					from = h
					local last = h + CH
					if last > n then last = n end
					part = redis.call('GETRANGE', key, offs(at), offs(HDR + last * 8 - 1))
				end
				off = struct.unpack('<d', part, (h - from) * 8 + 1)
			end
			-- (No version writes an event given back or not a number in
			-- a room log: such a log is decideKeys's.)
			if not (off >= 0) then return false end
			if b + off + W > now then break end
			h = h + 1
		end
		local units = n - h
		local newest
		if units > 0 then newest = b + newOff end
		local reset = 0
		if newest and newest + W > now then reset = newest + W - now end
		if units + 1 > limit then
			local left = limit - units
			if left < 0 then left = 0 end
			local i = h + units + 1 - limit
			local at = HDR + (i - 1) * 8
			local off
			if at + 8 <= m then
				off = struct.unpack('<d', raw, at + 1)
			elseif part and i > from and i <= from + #part / 8 then
				off = struct.unpack('<d', part, (i - 1 - from) * 8 + 1)
			else
				off = struct.unpack('<d', redis.call('GETRANGE', key, offs(at), offs(at + 7)))
			end
			if not (off >= 0) then return false end
			local retry = b + off + W - now
			if h ~= h0 then
				if units == 0 then
					redis.call('DEL', key)
				else
					redis.call('SETRANGE', key, '0', struct.pack('<ddBBI4I4', NS + d, units, 0, 1, h, n))
				end
			end
			return 0, left, retry, reset, 0
		end
		if reset < W then reset = W end
		local t = now
		if newest and newest > t then t = newest end
		if t - b >= P52 then return false end
		if roomFull(h, n, cap) then
			local evs = ''
			if units > 0 and HDR + n * 8 <= m then
				evs = sub(raw, HDR + h * 8 + 1, HDR + n * 8)
			elseif units > 0 then
				evs = redis.call('GETRANGE', key, offs(HDR + h * 8), offs(HDR + n * 8 - 1))
			end
			roomWrite(key, W, d, evs, units, t)
		else
			roomAppend(key, W, b, d, h, n, cap, expOff, units, t)
		end
		return 1, limit - units - 1, 0, reset, t - now
	end
	-- logPlainOne decides a request of the one key key, a log of window W
	-- and limit, and a cost of 1 (most requests of most log zones), as
	-- logPlainRead, decidePlain's arithmetic and logPlainTake or
	-- logPlainKeep do, without decidePlain's tables and loops, and for a
	-- log of up to PLAIN bytes of events, read in two parts: false, having
	-- written nothing, when decideKeys must decide it; else whether
	-- allowed (1 or 0), the units left, the retry, the reset and the
	-- logged time (from now).
	local function logPlainOne(key, W, limit)
		if limit < 1 then return false end
		local raw = redis.call('GETRANGE', key, '0', WIN_END)
		local m = #raw
		if m == 0 then
			logPlainTake(key, W, now)
			return 1, limit - 1, 0, W, 0
		end
		-- (A log with room whose header does not match is decideKeys's.)
		if m >= HDR + 24 and struct.unpack('<I4', raw, HDR + 1) == MAGIC then return roomOne(key, W, limit, raw, m) end
		local rest
		if m == HDR + WIN * 8 then
			local _, _, wide, _, _, n = struct.unpack('<ddBBI4I4', raw)
			if wide == 0 and n * 8 < PLAIN then
				local last = HDR + n * 8
				rest = redis.call('GETRANGE', key, offs(HDR + WIN * 8), offs(last))
				m = m + #rest
			end
		end
		local d, h0, n, sum = plainHeader(raw, m)
		if not d then return false end
		local h, units, newest = pruneWhole(raw, d * E9, h0, n, sum, W, rest)
		local reset = 0
		if newest and newest + W > now then reset = newest + W - now end
		if units + 1 > limit then
			local left = limit - units
			if left < 0 then left = 0 end
			local retry = logPlainEvent(raw, d, h + units + 1 - limit, rest) + W - now
			logPlainKeep(key, d, h0, h, units, n, newest)
			return 0, left, retry, reset, 0
		end
		if reset < W then reset = W end
		local t = now
		if newest and newest > t then t = newest end
		if t - d * E9 >= P52 then return false end
		logPlainTake(key, W, t, raw, d, h, units, n, rest)
		return 1, limit - units - 1, 0, reset, t - now
	end
	-- END PLAIN LOGS

	Llib = {load = logLoad, decide = logDecide, take = logTake, keep = logKeep, refund = logRefund, grant = logGrant, rewrite = logRewrite}
	Llib.settle = logSettle -- SETTLE
	Llib.plainRead, Llib.plainEvent, Llib.plainTake, Llib.plainKeep = logPlainRead, logPlainEvent, logPlainTake, logPlainKeep
	Llib.plainOne = logPlainOne
	return Llib
end

