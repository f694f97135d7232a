package algorithms

import (
	"sync/atomic"
	"time"
)

// Alignments of a calendar window, as written in the `align` zone field.
const (
	AlignHour  = "hour"
	AlignDay   = "day"
	AlignMonth = "month"
)

// AlignWindow is the window a zone must state for each alignment: the
// rate is written per the nominal length of one calendar unit (a month as
// 30 days), and each calendar unit gets the whole limit, whatever its real
// length (a day of 23 or 25 hours, a February).
var AlignWindow = map[string]int64{
	AlignHour:  int64(time.Hour),
	AlignDay:   24 * int64(time.Hour),
	AlignMonth: 30 * 24 * int64(time.Hour),
}

// Calendar cuts time into the hours, days or months of a time zone, for a
// fixed window aligned to the calendar rather than to the Unix epoch.
type Calendar struct {
	Align string
	Loc   *time.Location
	// last is the window found last: a decision usually falls in it, and
	// finding a window in a time zone costs a few hundred nanoseconds.
	last atomic.Pointer[[2]int64]
}

// NewCalendar returns the calendar of align ("hour", "day" or "month") in
// the IANA time zone tz ("" is UTC).
func NewCalendar(align, tz string) (*Calendar, error) {
	if _, ok := AlignWindow[align]; !ok {
		return nil, fieldErrorf("align", "align must be hour, day or month, got %q", align)
	}
	loc := time.UTC
	if tz == "Local" {
		// Each server's own setting: instances of a fleet could cut
		// different days.
		return nil, fieldErrorf("timezone", "timezone: name the time zone (such as Asia/Dhaka) rather than Local, which depends on each server's settings")
	}
	if tz != "" {
		var err error
		if loc, err = time.LoadLocation(tz); err != nil {
			return nil, fieldErrorf("timezone", "timezone: unknown time zone %q (an IANA name such as Asia/Dhaka or America/New_York)", tz)
		}
	}
	return &Calendar{Align: align, Loc: loc}, nil
}

// String writes c as a Caddyfile would: "day in Asia/Dhaka".
func (c *Calendar) String() string { return c.Align + " in " + c.Loc.String() }

// Bounds returns the window that contains now: [start, end), Unix
// nanoseconds. An hour is the hour of the local clock (cut short where
// the clocks change by half an hour), a day runs from local midnight
// to the next (23 or 25 hours on a day the clocks change), a month from
// its first day's midnight to the next month's.
func (c *Calendar) Bounds(now int64) (start, end int64) {
	if b := c.last.Load(); b != nil && b[0] <= now && now < b[1] {
		return b[0], b[1]
	}
	start, end = Bounds(c.Align, c.Loc, now)
	c.last.Store(&[2]int64{start, end})
	return start, end
}

// End returns the end of the window that starts at start.
func (c *Calendar) End(start int64) int64 {
	_, end := c.Bounds(start)
	return end
}

// Bounds is the window of align in loc that contains now, computed
// without a cache: a pure function of its arguments.
func Bounds(align string, loc *time.Location, now int64) (start, end int64) {
	t := time.Unix(0, now).In(loc)
	switch align {
	case AlignHour:
		// The local hour began this many nanoseconds ago. Where the
		// clocks change by half an hour, a change of the clocks also
		// ends an hour, so that windows never overlap.
		into := int64(t.Minute())*int64(time.Minute) + int64(t.Second())*int64(time.Second) + int64(t.Nanosecond())
		start, end = now-into, now-into+int64(time.Hour)
		zs, ze := t.ZoneBounds()
		if !zs.IsZero() {
			start = max(start, zs.UnixNano())
		}
		if !ze.IsZero() {
			end = min(end, ze.UnixNano())
		}
		return start, end
	case AlignMonth:
		y, m, _ := t.Date()
		return clampBounds(now, time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc), AlignWindow[AlignMonth])
	}
	y, m, d := t.Date()
	return clampBounds(now, time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc), AlignWindow[AlignDay])
}

// clampBounds keeps now within [from, to). Where a zone skips local
// midnight (a change of the clocks at 00:00), time.Date may place the
// missing midnight after now: the window then starts at now, and a window
// always has a length.
func clampBounds(now int64, from, to time.Time, nominal int64) (start, end int64) {
	start, end = from.UnixNano(), to.UnixNano()
	if start > now {
		start = now
	}
	if end <= now {
		end = start + nominal
	}
	return start, end
}

// CheckAlign validates a calendar window for the named algorithm and
// policy, naming the field.
func CheckAlign(align, tz, alg string, p Policy) error {
	if align == "" {
		if tz != "" {
			return fieldErrorf("timezone", "timezone applies only with align (hour, day or month)")
		}
		return nil
	}
	if _, err := NewCalendar(align, tz); err != nil {
		return err
	}
	if alg != NameFixedWindow {
		return fieldErrorf("align", "align applies only to algorithm fixed_window, not %s", alg)
	}
	if want := AlignWindow[align]; p.Window != want {
		spelled := map[string]string{AlignHour: "1h", AlignDay: "1d", AlignMonth: "30d"}[align]
		return fieldErrorf("align", "align %s needs a window of %s (such as rate 100/%s), got %s", align, spelled, spelled, FormatSpan(p.Window))
	}
	return nil
}
