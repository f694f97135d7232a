package algorithms

// Window is the state of the fixed window: the start of the window the
// count belongs to, and the units counted in it. 16 bytes.
type Window struct {
	Start int64
	Count int64
}

// FixedWindow is the fixed window counter of seed part 3.1: time is cut into
// windows aligned to the Unix epoch (a 1m window starts on the minute, a 1d
// window at midnight UTC) and each admits Limit units. It is the cheapest
// algorithm and the least exact: a client can spend a whole window's quota
// at the end of one window and again at the start of the next, up to twice
// Limit within one Window of time (the boundary burst).
type FixedWindow struct{ p Policy }

// NewFixedWindow returns the fixed window for p. p must be valid.
func NewFixedWindow(p Policy) *FixedWindow { return &FixedWindow{p: p} }

func (a *FixedWindow) Policy() Policy { return a.p }

// current returns the window now belongs to and the units counted in it.
// A clock that stepped back into an earlier window keeps the later one, so
// it cannot reopen a spent window.
func (a *FixedWindow) current(s Window, now int64) (start, count int64) {
	start = now - now%a.p.Window
	if start <= s.Start {
		return s.Start, s.Count
	}
	return start, 0
}

func (a *FixedWindow) Decide(s Window, now, cost int64) Result {
	cost = max(cost, 0)
	start, count := a.current(s, now)
	end := start + a.p.Window - now
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

func (a *FixedWindow) Refund(s Window, now, cost int64) Window {
	start, count := a.current(s, now)
	if start != s.Start {
		return s // the units were counted in a window that is over
	}
	return Window{Start: start, Count: max(count-max(cost, 0), 0)}
}

func (a *FixedWindow) IdleAt(s Window) int64 {
	if s.Count == 0 {
		return 0
	}
	return s.Start + a.p.Window
}

// Rebase keeps the state: it records events, not a rate, so a new policy
// reads it as it is.
func (a *FixedWindow) Rebase(s Window, _ int64, _ Policy) Window { return s }
