package algorithms

import (
	"strings"
	"testing"
	"time"
)

func utc(s string) int64 {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UnixNano()
}

// The windows of each alignment, in zones with and without daylight
// saving time, at the edges of days, of changes of the clocks and of
// months.
func TestBounds(t *testing.T) {
	tests := []struct {
		name, align, tz, now string
		start, end           string
		hours                float64 // the window's real length
	}{
		{"Dhaka: the last second of a day", AlignDay, "Asia/Dhaka", "2026-03-15T17:59:59Z", "2026-03-14T18:00:00Z", "2026-03-15T18:00:00Z", 24},
		{"Dhaka: midnight starts the next", AlignDay, "Asia/Dhaka", "2026-03-15T18:00:00Z", "2026-03-15T18:00:00Z", "2026-03-16T18:00:00Z", 24},
		{"UTC day", AlignDay, "", "2026-03-15T00:00:00Z", "2026-03-15T00:00:00Z", "2026-03-16T00:00:00Z", 24},
		{"New York: the spring change makes a 23-hour day", AlignDay, "America/New_York", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23},
		{"New York: the autumn change makes a 25-hour day", AlignDay, "America/New_York", "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25},
		{"New York: the day before the spring change", AlignDay, "America/New_York", "2026-03-08T04:59:59Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z", 24},
		{"New York: 1:30 EDT, the first of two", AlignHour, "America/New_York", "2026-11-01T05:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", 1},
		{"New York: 1:30 EST, the second", AlignHour, "America/New_York", "2026-11-01T06:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z", 1},
		{"New York: 3:30 EDT, just after the spring change", AlignHour, "America/New_York", "2026-03-08T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z", 1},
		{"Kolkata's hours start at :30 UTC", AlignHour, "Asia/Kolkata", "2026-05-01T10:15:00Z", "2026-05-01T09:30:00Z", "2026-05-01T10:30:00Z", 1},
		{"February of a leap year", AlignMonth, "", "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24},
		{"February of another year", AlignMonth, "", "2026-02-10T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28 * 24},
		{"January 31", AlignMonth, "", "2026-01-31T12:00:00Z", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", 31 * 24},
		{"December into the next year", AlignMonth, "", "2026-12-31T23:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31 * 24},
		{"Dhaka: February begins at 18:00 UTC on January 31", AlignMonth, "Asia/Dhaka", "2026-01-31T19:00:00Z", "2026-01-31T18:00:00Z", "2026-02-28T18:00:00Z", 28 * 24},
		{"New York: March holds the spring change", AlignMonth, "America/New_York", "2026-03-20T00:00:00Z", "2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z", 31*24 - 1},
		{"New York: November holds the autumn change", AlignMonth, "America/New_York", "2026-11-20T00:00:00Z", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", 30*24 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cal, err := NewCalendar(tt.align, tt.tz)
			if err != nil {
				t.Fatal(err)
			}
			now := utc(tt.now)
			start, end := Bounds(tt.align, cal.Loc, now)
			if start != utc(tt.start) || end != utc(tt.end) {
				t.Fatalf("Bounds(%s) = [%v, %v), want [%s, %s)", tt.now, time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), tt.start, tt.end)
			}
			if got := time.Duration(end - start).Hours(); got != tt.hours {
				t.Fatalf("the window lasts %vh, want %vh", got, tt.hours)
			}
			// The memo gives the same answers, in and out of order.
			for _, at := range []int64{now, start, end - 1, end, start - 1, now} {
				s1, e1 := cal.Bounds(at)
				s2, e2 := Bounds(tt.align, cal.Loc, at)
				if s1 != s2 || e1 != e2 || at < s1 || at >= e1 {
					t.Fatalf("Calendar.Bounds(%d) = [%d, %d), Bounds = [%d, %d)", at, s1, e1, s2, e2)
				}
			}
			if cal.End(start) != end {
				t.Fatalf("End(start) = %d, want %d", cal.End(start), end)
			}
		})
	}
}

// Every instant of two years belongs to exactly one window: windows
// follow each other without gaps or overlaps, in every zone tested.
func TestBoundsTile(t *testing.T) {
	for _, tz := range []string{"UTC", "Asia/Dhaka", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"} {
		for _, align := range []string{AlignHour, AlignDay, AlignMonth} {
			loc, err := time.LoadLocation(tz)
			if err != nil {
				t.Fatal(err)
			}
			from, to := utc("2026-01-01T00:00:00Z"), utc("2028-01-01T00:00:00Z")
			start, end := Bounds(align, loc, from)
			for end < to {
				s, e := Bounds(align, loc, end)
				if s != end || e <= s {
					t.Fatalf("%s %s: the window after [%v, %v) is [%v, %v)", align, tz, time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), time.Unix(0, s).UTC(), time.Unix(0, e).UTC())
				}
				if s2, _ := Bounds(align, loc, e-1); s2 != s {
					t.Fatalf("%s %s: the window's last instant starts another window", align, tz)
				}
				start, end = s, e
			}
		}
	}
}

// A calendar window admits the limit per calendar day, and tells a denied
// client to wait until local midnight, over a 23-hour day too.
func TestCalendarWindow(t *testing.T) {
	cal, err := NewCalendar(AlignDay, "America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	a := NewCalendarWindow(Policy{Limit: 2, Window: AlignWindow[AlignDay]}, cal)
	now := utc("2026-03-08T20:00:00Z") // 16:00 EDT on the 23-hour day
	var s Window
	for range 2 {
		if r := a.Decide(s, now, 1); !r.Allowed {
			t.Fatalf("denied: %+v", r)
		}
		s = a.Take(s, now, 1)
	}
	r := a.Decide(s, now, 1)
	midnight := utc("2026-03-09T04:00:00Z")
	if r.Allowed || r.RetryAfter != midnight-now || r.ResetAfter != midnight-now {
		t.Fatalf("third request: %+v, want a wait of %v", r, time.Duration(midnight-now))
	}
	if a.IdleAt(s) != midnight {
		t.Fatalf("idle at %v, want local midnight", time.Unix(0, a.IdleAt(s)).UTC())
	}
	if r := a.Decide(s, midnight, 1); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("at midnight: %+v", r)
	}
	// A refund after midnight gives nothing back to the new day.
	if got := a.Refund(s, midnight, Result{Allowed: true, At: now}, 1); got != s {
		t.Fatalf("refund into the next day: %+v", got)
	}
	if got := a.Refund(s, now+1, Result{Allowed: true, At: now}, 1); got.Count != 1 {
		t.Fatalf("refund the same day: %+v", got)
	}
}

func TestCheckAlign(t *testing.T) {
	day := Policy{Limit: 5000, Window: AlignWindow[AlignDay]}
	tests := []struct {
		align, tz, alg string
		p              Policy
		want           string
	}{
		{AlignDay, "Asia/Dhaka", NameFixedWindow, day, ""},
		{AlignMonth, "", NameFixedWindow, Policy{Limit: 1, Window: AlignWindow[AlignMonth]}, ""},
		{AlignDay, "Asia/Dhakka", NameFixedWindow, day, `timezone: unknown time zone "Asia/Dhakka"`},
		{"week", "", NameFixedWindow, day, `align must be hour, day or month, got "week"`},
		{AlignDay, "", NameSlidingWindow, day, "align applies only to algorithm fixed_window, not sliding_window"},
		{AlignDay, "", NameFixedWindow, Policy{Limit: 1, Window: int64(time.Hour)}, "align day needs a window of 1d (such as rate 100/1d), got 1h"},
		{AlignHour, "", NameFixedWindow, day, "align hour needs a window of 1h (such as rate 100/1h), got 24h"},
		{"", "Asia/Dhaka", NameFixedWindow, day, "timezone applies only with align"},
		{AlignDay, "Local", NameFixedWindow, day, "rather than Local"},
		{AlignDay, "../../etc/passwd", NameFixedWindow, day, "unknown time zone"},
		{AlignDay, "asia/dhaka", NameFixedWindow, day, "unknown time zone"},
	}
	for _, tt := range tests {
		err := CheckAlign(tt.align, tt.tz, tt.alg, tt.p)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: error %v, want %q", tt, err, tt.want)
		}
	}
}
