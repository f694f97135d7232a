package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// calendarArg writes a calendar window's p1 script argument: the nominal
// window, then the boundaries of the windows before, around and after the
// one that holds this instance's clock. The script has no time zone rules,
// and decides with Redis's TIME: it picks among these the window that
// holds its own clock, so instances agree as long as their clocks are
// within a window of Redis's.
type calendarArg struct {
	cal  *algorithms.Calendar
	w    string // the nominal window, ns
	last atomic.Pointer[calendarCache]
}

type calendarCache struct {
	start, end int64
	arg        any
}

// arg is the argument for a decision at now, made once per window.
func (c *calendarArg) arg(now int64) any {
	if l := c.last.Load(); l != nil && l.start <= now && now < l.end {
		return l.arg
	}
	start, end := c.cal.Bounds(now)
	prev, _ := c.cal.Bounds(start - 1)
	next := c.cal.End(end)
	v := c.w + "@" + strconv.FormatInt(prev, 10) + "," + strconv.FormatInt(start, 10) + "," +
		strconv.FormatInt(end, 10) + "," + strconv.FormatInt(next, 10)
	c.last.Store(&calendarCache{start: start, end: end, arg: v})
	return v
}

// budgetItem sets what a spend budget adds to an item: a calendar
// window's boundaries, and r's reservation.
func (s *Store) budgetItem(it *item, r backend.Request) {
	if it.conf.cal != nil {
		it.p1 = it.conf.cal.arg(s.now())
	}
	if r.Reserve > 0 {
		it.token = "t" + strconv.FormatUint(r.Token, 10)
		ms := (r.Reserve + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		it.resv = strconv.FormatInt(ms, 10) + ":" + it.token
	}
}

// SettleReservations commits or releases the reservations an allowed Decide of reqs
// made (backend.Reserver): one script call removes each reservation and,
// for a release, refunds its units only if it was still there.
func (s *Store) SettleReservations(ctx context.Context, reqs []backend.Request, granted []algorithms.Result, commit bool) error {
	items, of, err := s.resolve(reqs)
	if err != nil {
		return err
	}
	// An item's reservation was made by its first request, at its time.
	first := make([]algorithms.Result, len(items))
	seen := make([]bool, len(items))
	var which []int
	for i, r := range reqs {
		j := of[i]
		if seen[j] {
			continue
		}
		seen[j] = true
		first[j] = granted[i]
		if r.Reserve > 0 && granted[i].Allowed && items[j].cost > 0 {
			which = append(which, j)
		}
	}
	if len(which) == 0 {
		return nil
	}
	mode := modeRelease
	if commit {
		mode = modeCommit
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.refund(ctx, mode, items, which, first)
}

// Interface guard.
var _ backend.Reserver = (*Store)(nil)
