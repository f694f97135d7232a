package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what simulate prints (and --json writes).
type Report struct {
	Files       []string         `json:"files"`
	Lines       int64            `json:"lines"`
	Requests    int64            `json:"requests"`
	OtherLines  int64            `json:"other_lines"`
	Malformed   int64            `json:"malformed"`
	Examples    []Malformed      `json:"malformed_lines,omitempty"`
	Late        int64            `json:"late"`
	From        string           `json:"from,omitempty"`
	To          string           `json:"to,omitempty"`
	Seconds     float64          `json:"replay_seconds"`
	Passed      int64            `json:"passed"`
	Refused     map[string]int64 `json:"refused"`
	Notes       []string         `json:"notes"`
	NotReplayed []Excluded       `json:"not_replayed"`
	Limits      []LimitReport    `json:"limits"`
	Unrouted    int64            `json:"unrouted,omitempty"`
	// Measured is set for recommend's pass, every zone in shadow.
	Measured bool `json:"-"`
}

// LimitReport is one limit's lines of the report.
type LimitReport struct {
	Zone        string        `json:"zone"`
	Scope       string        `json:"scope"`
	Mode        string        `json:"mode"` // enforce or shadow
	Algorithm   string        `json:"algorithm"`
	Rate        string        `json:"rate"`
	Requests    int64         `json:"requests"`
	Denied      int64         `json:"denied"`
	DeniedRatio float64       `json:"denied_ratio"`
	Keys        int           `json:"keys"`
	DeniedKeys  int           `json:"denied_keys"`
	TopDenied   []KeyCount    `json:"top_denied"`
	WorstMinute *Minute       `json:"worst_minute,omitempty"`
	Timeline    Timeline      `json:"timeline"`
	Sparkline   string        `json:"sparkline"`
	Caveats     []string      `json:"caveats,omitempty"`
	Peaks       *Distribution `json:"peaks,omitempty"`
	PeakValues  []int64       `json:"-"`
	Limit       int64         `json:"-"` // max_events, for drawing
	Window      int64         `json:"-"`
	TopClients  []KeyCount    `json:"-"`
}

// sparkBins is how many characters a sparkline has.
const sparkBins = 48

// NewReport is the report of a replay of plan.
func NewReport(plan *Plan, res *Result) *Report {
	rep := &Report{
		Files: res.Files, Lines: res.Lines, Requests: res.Entries, OtherLines: res.Other,
		Malformed: res.Malformed, Examples: res.MalformedExamples, Late: res.Late,
		Seconds: res.Elapsed.Seconds(), Passed: res.Passed, Refused: map[string]int64{},
		Notes: append([]string{}, plan.Notes...), NotReplayed: plan.NotReplayed, Unrouted: res.Unrouted,
	}
	if rep.NotReplayed == nil {
		rep.NotReplayed = []Excluded{}
	}
	for code, n := range res.Refused {
		rep.Refused[fmt.Sprint(code)] = n
	}
	if res.Entries > 0 {
		rep.From, rep.To = stamp(res.First), stamp(res.Last)
	}
	if res.Late > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d requests took longer than the reorder window (the longest %s) and were decided at the time of the request before them (raise --reorder)", res.Late, time.Duration(res.LongestLate).Round(time.Millisecond)))
	}
	if res.Unrouted > 0 && len(plan.Servers) > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d lines name a logger of no single server: replayed through server %q (--server)", res.Unrouted, res.UnroutedServer))
	}
	from, to := floorDiv(res.First, 60e9), floorDiv(res.Last, 60e9)+1
	for _, ls := range res.Limits {
		rep.Limits = append(rep.Limits, limitReport(plan, ls, from, to))
	}
	if rep.Limits == nil {
		rep.Limits = []LimitReport{}
	}
	return rep
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

func limitReport(plan *Plan, ls *LimitStats, from, to int64) LimitReport {
	lr := LimitReport{Zone: ls.Zone, Scope: ls.Scope, Mode: "enforce", Requests: ls.Requests, Denied: ls.Denied,
		Keys: ls.Keys(), DeniedKeys: ls.DeniedKeys(), TopDenied: ls.TopDenied(10), TopClients: ls.TopClients(10)}
	if ls.Shadow {
		lr.Mode = "shadow"
	}
	if lr.TopDenied == nil {
		lr.TopDenied = []KeyCount{}
	}
	if ls.Requests > 0 {
		lr.DeniedRatio = float64(ls.Denied) / float64(ls.Requests)
	}
	if z := plan.Zones[ls.Zone]; z != nil {
		for _, li := range z.Limits {
			if li.Scope == ls.Scope {
				lr.Algorithm, lr.Rate, lr.Limit, lr.Window = li.Algorithm, li.Rate(), li.MaxEvents, li.Window
				if li.Burst > 0 {
					lr.Rate += fmt.Sprintf(" burst %d", li.Burst)
				}
			}
		}
	}
	if lr.Algorithm == "" {
		lr.Algorithm, lr.Rate = "tier", "tier "+ls.Scope
	}
	if m, ok := ls.WorstMinute(); ok {
		lr.WorstMinute = &m
	}
	lr.Timeline = ls.Timeline(from, to, sparkBins)
	lr.Sparkline = Sparkline(lr.Timeline.Denied)
	for _, h := range slices.Sorted(maps.Keys(ls.Absent)) {
		n := ls.Absent[h]
		switch {
		case n == ls.Requests:
			lr.Caveats = append(lr.Caveats, fmt.Sprintf("no request it decided has %s in the log: if the log's format deletes it, this limit's keys are not the live ones", h))
		case n > 0:
			lr.Caveats = append(lr.Caveats, fmt.Sprintf("%d of its requests have no %s in the log (all of them share one key)", n, h))
		}
	}
	if ls.Unknown > 0 {
		lr.Caveats = append(lr.Caveats, fmt.Sprintf("%d requests it admitted were refused live with Retry-After: their response is not in the log, and the replay answered them 200", ls.Unknown))
	}
	if ls.window > 0 {
		d := ls.Peaks()
		lr.Peaks = &d
		lr.PeakValues = ls.PeakValues()
	}
	return lr
}

// WriteJSON writes v indented.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteText prints the simulate report for people.
func (rep *Report) WriteText(w io.Writer) error {
	rep.writeHeader(w)
	if len(rep.Limits) == 0 {
		fmt.Fprintln(w, "No request reached a replayed zone.")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSCOPE\tMODE\tRATE\tALGORITHM\tREQUESTS\tWOULD DENY\tKEYS\tKEYS DENIED\tWORST MINUTE")
	for _, l := range rep.Limits {
		worst := "-"
		if l.WorstMinute != nil {
			worst = fmt.Sprintf("%s (%d of %d)", time.Unix(l.WorstMinute.Start, 0).UTC().Format("2006-01-02 15:04"), l.WorstMinute.Denied, l.WorstMinute.Requests)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d (%s)\t%d\t%d\t%s\n", l.Zone, dash(l.Scope), l.Mode, l.Rate, l.Algorithm,
			l.Requests, l.Denied, pct(l.Denied, l.Requests), l.Keys, l.DeniedKeys, worst)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range rep.Limits {
		fmt.Fprintf(w, "\n%s:\n", limitName(l.Zone, l.Scope))
		t := l.Timeline
		fmt.Fprintf(w, "  denials  |%s|  %s to %s UTC, %s a character\n", l.Sparkline,
			time.Unix(t.Start, 0).UTC().Format("2006-01-02 15:04"),
			time.Unix(t.Start+t.BinSeconds*int64(len(t.Denied)), 0).UTC().Format("2006-01-02 15:04"),
			FormatWindow(t.BinSeconds*1e9))
		if len(l.TopDenied) > 0 {
			var parts []string
			for _, k := range l.TopDenied {
				parts = append(parts, fmt.Sprintf("%s (%d of %d)", shownKey(k.Key), k.Denied, k.Requests))
			}
			fmt.Fprintf(w, "  most denied: %s\n", strings.Join(parts, ", "))
		}
		if l.Peaks != nil {
			fmt.Fprintf(w, "  per key, most in any %s: %s\n", FormatWindow(l.Window), l.Peaks.text())
		}
		for _, c := range l.Caveats {
			fmt.Fprintf(w, "  note: %s\n", c)
		}
	}
	return nil
}

func (d Distribution) text() string {
	return fmt.Sprintf("p50 %d, p90 %d, p99 %d, p99.9 %d, max %d (%d keys)", d.P50, d.P90, d.P99, d.P999, d.Max, d.Keys)
}

func (rep *Report) writeHeader(w io.Writer) {
	span := ""
	if rep.From != "" {
		a, _ := time.Parse(time.RFC3339Nano, rep.From)
		b, _ := time.Parse(time.RFC3339Nano, rep.To)
		span = fmt.Sprintf(", %s to %s UTC", a.Format("2006-01-02 15:04:05"), b.Format("2006-01-02 15:04:05"))
	}
	fmt.Fprintf(w, "Replayed %d requests of %d lines in %d file(s)%s, in %.1fs.\n", rep.Requests, rep.Lines, len(rep.Files), span, rep.Seconds)
	var refused []string
	for _, code := range slices.Sorted(maps.Keys(rep.Refused)) {
		refused = append(refused, fmt.Sprintf("%d × %s", rep.Refused[code], code))
	}
	if rep.Measured {
		fmt.Fprintln(w, "Every zone measured in shadow mode, so that each sees every request that reaches it.")
	} else if len(refused) > 0 {
		fmt.Fprintf(w, "Passed %d, refused %s.\n", rep.Passed, strings.Join(refused, ", "))
	} else {
		fmt.Fprintf(w, "Passed %d, refused none.\n", rep.Passed)
	}
	if rep.OtherLines > 0 {
		fmt.Fprintf(w, "Skipped %d lines of other loggers.\n", rep.OtherLines)
	}
	if rep.Malformed > 0 {
		fmt.Fprintf(w, "Malformed lines: %d (not replayed):\n", rep.Malformed)
		for _, m := range rep.Examples {
			fmt.Fprintf(w, "  %s:%d: %s\n", m.File, m.Line, m.Error)
		}
		if int64(len(rep.Examples)) < rep.Malformed {
			fmt.Fprintf(w, "  … and %d more\n", rep.Malformed-int64(len(rep.Examples)))
		}
	}
	for _, e := range rep.NotReplayed {
		fmt.Fprintf(w, "NOT REPLAYED: zone %q: %s.\n", e.Zone, e.Reason)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "Note: %s.\n", n)
	}
	fmt.Fprintln(w)
}

func limitName(zone, scope string) string {
	if scope == "" {
		return "zone " + zone
	}
	return "zone " + zone + ", scope " + scope
}

func shownKey(k string) string {
	if k == "" {
		return "(no key)"
	}
	return k
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func pct(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}
