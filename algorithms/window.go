package algorithms

// Window is the state of the fixed window: the start of the window the
// count belongs to, and the units counted in it. 16 bytes.
type Window struct {
	Start int64
	Count int64
}

// FixedWindow is the fixed window counter: time is cut into
// windows aligned to the Unix epoch (a 1m window starts on the minute, a 1d
// window at midnight UTC) and each admits Limit units. It is the cheapest
// algorithm and the least exact: a client can spend a whole window's quota
// at the end of one window and again at the start of the next, up to twice
// Limit within one Window of time (the boundary burst).
//
// With a Calendar, windows are the calendar's hours, days or months
// instead, in its time zone (calendar.go).
type FixedWindow struct {
	p   Policy
	cal *Calendar // nil: windows of p.Window from the epoch
}

// NewFixedWindow returns the fixed window for p. p must be valid.
func NewFixedWindow(p Policy) *FixedWindow { return &FixedWindow{p: p} }

// NewCalendarWindow returns the fixed window for p over the windows of
// cal; a nil cal is NewFixedWindow.
func NewCalendarWindow(p Policy, cal *Calendar) *FixedWindow { return &FixedWindow{p: p, cal: cal} }

// Calendar is the window's calendar, nil for epoch-aligned windows.
func (a *FixedWindow) Calendar() *Calendar { return a.cal }

// start is the start of the window that contains now.
func (a *FixedWindow) start(now int64) int64 {
	if a.cal != nil {
		s, _ := a.cal.Bounds(now)
		return s
	}
	return now - now%a.p.Window
}

// end is the end of the window that starts at start.
func (a *FixedWindow) end(start int64) int64 {
	if a.cal != nil {
		return a.cal.End(start)
	}
	return start + a.p.Window
}

func (a *FixedWindow) Policy() Policy { return a.p }

// current returns the window now belongs to and the units counted in it.
// A clock that stepped back into an earlier window keeps the later one, so
// it cannot reopen a spent window.
func (a *FixedWindow) current(s Window, now int64) (start, count int64) {
	start = a.start(now)
	if start <= s.Start {
		return s.Start, s.Count
	}
	return start, 0
}

func (a *FixedWindow) Decide(s Window, now, cost int64) Result {
	cost = max(cost, 0)
	start, count := a.current(s, now)
	end := a.end(start) - now
	reset := end
	if count == 0 && cost == 0 {
		reset = 0
	}
	r, done := counted(a.p.Limit, count, cost, reset)
	if !done {
		r.RetryAfter = end
	}
	return r
}

func (a *FixedWindow) Take(s Window, now, cost int64) Window {
	start, count := a.current(s, now)
	return Window{Start: start, Count: count + max(cost, 0)}
}

// Refund takes the units back out of the window they were counted in, if
// that window is still the current one.
func (a *FixedWindow) Refund(s Window, now int64, granted Result, cost int64) Window {
	start, count := a.current(s, now)
	if start != s.Start || granted.At < start {
		return s
	}
	return Window{Start: start, Count: max(count-max(cost, 0), 0)}
}

func (a *FixedWindow) IdleAt(s Window) int64 {
	if s.Count == 0 {
		return 0
	}
	return a.end(s.Start)
}

// Rebase moves the count onto the new window's grid when the window
// length changed: the units counted in the window that was current at the
// change are counted in the new window that contains the change, so the
// change neither frees nor locks quota beyond one window.
func (a *FixedWindow) Rebase(s Window, at int64, old Policy) Window {
	if a.cal != nil {
		// A calendar fixes the window's length: only a window that
		// ended before the change is dropped.
		if s.Count != 0 && a.end(s.Start) <= at {
			return Window{}
		}
		return s
	}
	if old.Window == a.p.Window || s.Count == 0 {
		return s
	}
	if s.Start+old.Window <= at {
		return Window{} // that window was over before the change
	}
	return Window{Start: at - at%a.p.Window, Count: s.Count}
}
