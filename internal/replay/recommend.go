package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The rules that turn the per-key peaks into a limit.
const (
	// RuleP99x3 is three times the p99 of the keys' peaks: the usual
	// first limit, with room for a busy user's growth.
	RuleP99x3 = "p99x3"
	// RuleP999 is the p99.9: one key in a thousand meets it.
	RuleP999 = "p999"
	// RuleMax is the busiest key's peak: nobody in this log is denied.
	RuleMax = "max"
	// ruleCurrent is the configured limit, for comparison.
	ruleCurrent = "current"

	DefaultRule = RuleP99x3
)

var rules = []string{RuleP99x3, RuleP999, RuleMax}

// Propose is the limit rule gives for the peaks d: at least 1.
func Propose(rule string, d Distribution) (int64, error) {
	var n int64
	switch rule {
	case RuleP99x3:
		n = 3 * d.P99
	case RuleP999:
		n = d.P999
	case RuleMax:
		n = d.Max
	default:
		return 0, fmt.Errorf("unknown rule %q: want p99x3, p999 or max", rule)
	}
	return max(n, 1), nil
}

// Recommendation is what recommend prints (and --json writes).
type Recommendation struct {
	Report *Report     `json:"replay"`
	Rule   string      `json:"rule"`
	Limits []LimitRec  `json:"limits"`
	Blocks []ZoneBlock `json:"blocks"`
}

// LimitRec is one limit's measures and candidates.
type LimitRec struct {
	Zone       string       `json:"zone"`
	Scope      string       `json:"scope"`
	Algorithm  string       `json:"algorithm"`
	Configured string       `json:"configured"`
	Window     string       `json:"window"`
	Requests   int64        `json:"requests"`
	Keys       int          `json:"keys"`
	Peaks      Distribution `json:"peaks"`
	Candidates []Candidate  `json:"candidates"`
	Skipped    string       `json:"skipped,omitempty"`
	TopClients []KeyCount   `json:"top_clients"`
	PeakValues []int64      `json:"-"`
	Timeline   Timeline     `json:"-"`
	// Proposed is the chosen rule's limit (0 when skipped).
	Proposed int64 `json:"proposed"`
}

// Candidate is one limit tried on the log.
type Candidate struct {
	Rule        string       `json:"rule"`
	MaxEvents   int64        `json:"max_events"`
	Burst       int64        `json:"burst,omitempty"`
	Rate        string       `json:"rate"`
	Denied      int64        `json:"denied"`
	DeniedRatio float64      `json:"denied_ratio"`
	DeniedKeys  int          `json:"denied_keys"`
	TopDenied   []string     `json:"top_clients_denied"`
	BurstNeeded Distribution `json:"burst_needed"`
	Chosen      bool         `json:"chosen"`
}

// ZoneBlock is a zone's config with the chosen rule's limits, to paste.
type ZoneBlock struct {
	Zone   string `json:"zone"`
	Format string `json:"format"` // caddyfile or json
	Text   string `json:"text"`
}

// candidateName names the zone replaying zone's candidates of rule.
func candidateName(zone, rule string) string { return zone + "~" + rule }

// Recommend measures each key's peak per limit (every zone in shadow, so
// each sees all the requests that reach it), then replays every candidate
// limit, each in a shadow zone of its own, in one more pass.
func Recommend(plan *Plan, opts Options, rule string) (*Recommendation, error) {
	if _, err := Propose(rule, Distribution{}); err != nil {
		return nil, err
	}
	for _, l := range opts.Logs {
		if l == "-" {
			return nil, fmt.Errorf("recommend reads the logs twice: give files, not standard input")
		}
	}
	shadowed, err := plan.WithZones(func(name string, z map[string]any) map[string]map[string]any {
		shadowZone(z)
		return map[string]map[string]any{name: z}
	})
	if err != nil {
		return nil, err
	}
	first, err := Replay(plan, shadowed, opts, true)
	if err != nil {
		return nil, err
	}
	rec := &Recommendation{Report: NewReport(plan, first), Rule: rule}
	rec.Report.Measured = true
	// The candidates of every limit, by zone and rule.
	values := map[string]map[string]map[string]int64{} // zone → rule → scope → max_events
	pass2 := &Plan{Zones: map[string]*ZoneInfo{}, Response: plan.Response, Loggers: plan.Loggers, Servers: plan.Servers}
	for _, lr := range rec.Report.Limits {
		z := plan.Zones[lr.Zone]
		li := limitInfo(z, lr.Scope)
		r := LimitRec{Zone: lr.Zone, Scope: lr.Scope, Algorithm: lr.Algorithm, Configured: lr.Rate,
			Requests: lr.Requests, Keys: lr.Keys, TopClients: lr.TopClients, PeakValues: lr.PeakValues, Timeline: lr.Timeline}
		switch {
		case li == nil || li.Tiered:
			r.Skipped = "a tiered limit: each tier is measured by its own scope"
		case lr.Peaks == nil:
			r.Skipped = "no window to measure over"
		}
		if r.Skipped != "" {
			rec.Limits = append(rec.Limits, r)
			continue
		}
		r.Peaks, r.Window = *lr.Peaks, FormatWindow(li.Window)
		least := constantCost(z, lr.Scope)
		for _, ru := range append(slices.Clone(rules), ruleCurrent) {
			n := li.MaxEvents
			if ru != ruleCurrent {
				n, _ = Propose(ru, r.Peaks)
			}
			n = max(n, least)
			if values[lr.Zone] == nil {
				values[lr.Zone] = map[string]map[string]int64{}
			}
			if values[lr.Zone][ru] == nil {
				values[lr.Zone][ru] = map[string]int64{}
			}
			values[lr.Zone][ru][lr.Scope] = n
			burst := scaledBurst(li, n)
			r.Candidates = append(r.Candidates, Candidate{Rule: ru, MaxEvents: n, Burst: burst, Rate: fmt.Sprintf("%d/%s", n, r.Window), Chosen: ru == rule})
			if ru == rule {
				r.Proposed = n
			}
			cz := candidateName(lr.Zone, ru)
			if pass2.Zones[cz] == nil {
				pass2.Zones[cz] = &ZoneInfo{Name: cz}
			}
			pass2.Zones[cz].Limits = append(pass2.Zones[cz].Limits, &LimitInfo{Zone: cz, Scope: lr.Scope, Algorithm: li.Algorithm, MaxEvents: n, Window: li.Window, Burst: burst})
		}
		rec.Limits = append(rec.Limits, r)
	}
	if len(values) > 0 {
		cfg, err := plan.WithZones(func(name string, z map[string]any) map[string]map[string]any {
			out := map[string]map[string]any{}
			for ru, scopes := range values[name] {
				c := deepCopy(z)
				shadowZone(c)
				setLimits(c, plan.Zones[name], scopes)
				out[candidateName(name, ru)] = c
			}
			return out
		})
		if err != nil {
			return nil, err
		}
		opts.Decisions = nil
		second, err := Replay(pass2, cfg, opts, true)
		if err != nil {
			return nil, err
		}
		for i := range rec.Limits {
			r := &rec.Limits[i]
			for j := range r.Candidates {
				c := &r.Candidates[j]
				ls := second.Limit(candidateName(r.Zone, c.Rule), r.Scope)
				if ls == nil {
					continue
				}
				c.Denied, c.DeniedKeys, c.BurstNeeded = ls.Denied, ls.DeniedKeys(), ls.Bursts()
				if ls.Requests > 0 {
					c.DeniedRatio = float64(ls.Denied) / float64(ls.Requests)
				}
				c.TopDenied = []string{}
				for _, k := range r.TopClients {
					if ls.KeyDenied(k.Key) {
						c.TopDenied = append(c.TopDenied, k.Key)
					}
				}
			}
		}
	}
	rec.Blocks = blocks(plan, opts, rec)
	if rec.Limits == nil {
		rec.Limits = []LimitRec{}
	}
	return rec, nil
}

// shadowZone makes z decide without denying; a lock-out needs denials, so
// it goes (shadow zones refuse it).
func shadowZone(z map[string]any) {
	z["shadow"] = true
	delete(z, "lockout")
	if scopes, ok := z["scopes"].(map[string]any); ok {
		for _, s := range scopes {
			if m, ok := s.(map[string]any); ok {
				delete(m, "lockout")
			}
		}
	}
}

func limitInfo(z *ZoneInfo, scope string) *LimitInfo {
	if z == nil {
		return nil
	}
	for _, l := range z.Limits {
		if l.Scope == scope {
			return l
		}
	}
	return nil
}

// constantCost is the limit's cost when it is a number (a limit must hold
// at least that), else 1.
func constantCost(z *ZoneInfo, scope string) int64 {
	m := limitJSON(z.raw, scope)
	if m == nil {
		return 1
	}
	if c, ok := m["cost"].(float64); ok && c >= 1 {
		return int64(c)
	}
	return 1
}

func limitJSON(z map[string]any, scope string) map[string]any {
	if scope == "" {
		return z
	}
	scopes, _ := z["scopes"].(map[string]any)
	m, _ := scopes[scope].(map[string]any)
	return m
}

// scaledBurst keeps a configured burst's ratio to max_events at a new
// max_events n (0: the default burst).
func scaledBurst(li *LimitInfo, n int64) int64 {
	if li.Burst == 0 || li.MaxEvents == 0 {
		return 0
	}
	return max(int64(math.Round(float64(li.Burst)*float64(n)/float64(li.MaxEvents))), 1)
}

// setLimits sets the candidate max_events of each limit of z (by scope).
func setLimits(z map[string]any, info *ZoneInfo, scopes map[string]int64) {
	for scope, n := range scopes {
		m := limitJSON(z, scope)
		if m == nil {
			continue
		}
		m["max_events"] = n
		if b := scaledBurst(limitInfo(info, scope), n); b > 0 {
			m["burst"] = b
		}
	}
}

func deepCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// blocks are the zones with the chosen rule's limits, to paste: the zone's
// block of the Caddyfile with its rate lines replaced, or its JSON.
func blocks(plan *Plan, opts Options, rec *Recommendation) []ZoneBlock {
	chosen := map[string]map[string]Candidate{}
	for _, r := range rec.Limits {
		for _, c := range r.Candidates {
			if c.Chosen {
				if chosen[r.Zone] == nil {
					chosen[r.Zone] = map[string]Candidate{}
				}
				chosen[r.Zone][r.Scope] = c
			}
		}
	}
	out := []ZoneBlock{}
	for _, zone := range slices.Sorted(maps.Keys(chosen)) {
		if opts.Adapter == "caddyfile" {
			if text, ok := caddyfileBlock(opts.Source, zone, chosen[zone]); ok {
				out = append(out, ZoneBlock{Zone: zone, Format: "caddyfile", Text: text})
				continue
			}
		}
		var z map[string]any
		_ = json.Unmarshal(plan.Zones[zone].Source, &z)
		z["shadow"] = true
		for scope, c := range chosen[zone] {
			if m := limitJSON(z, scope); m != nil {
				m["max_events"] = c.MaxEvents
				if c.Burst > 0 {
					m["burst"] = c.Burst
				}
			}
		}
		b, _ := json.MarshalIndent(map[string]any{zone: z}, "", "  ")
		out = append(out, ZoneBlock{Zone: zone, Format: "json", Text: string(b)})
	}
	return out
}

// rateOptions are the Caddyfile lines a proposed rate replaces.
var rateOptions = map[string]bool{"rate": true, "events": true, "window": true, "burst": true, "cooldown": true}

// caddyfileBlock is the `zone <name> { … }` block of the Caddyfile source
// with each limit's rate lines replaced by the candidate's, and `shadow`
// added; false when the block is not in the file (an import, a snippet).
func caddyfileBlock(source, zone string, limits map[string]Candidate) (string, bool) {
	tokens, err := caddyfile.Tokenize([]byte(source), "Caddyfile")
	if err != nil {
		return "", false
	}
	start := -1
	for i := 0; i+2 < len(tokens); i++ {
		if tokens[i].Text == "zone" && tokens[i+1].Text == zone && tokens[i+2].Text == "{" && tokens[i+2].Line == tokens[i].Line {
			start = i
			break
		}
	}
	if start < 0 {
		return "", false
	}
	// Each line's first token and the nesting it is at; which scope block
	// a line is in.
	type lineInfo struct {
		first string
		depth int
		scope string
		open  bool // opens a scope block
	}
	lines := map[int]*lineInfo{}
	depth, end := 0, -1
	scope, scopeDepth := "", -1
	for i := start; i < len(tokens); i++ {
		t := tokens[i]
		if lines[t.Line] == nil {
			lines[t.Line] = &lineInfo{first: t.Text, depth: depth, scope: scope}
			if t.Text == "scope" && depth == 1 && i+1 < len(tokens) {
				lines[t.Line].open = true
				scope, scopeDepth = tokens[i+1].Text, depth+1
				lines[t.Line].scope = scope
			}
		}
		switch t.Text {
		case "{":
			depth++
		case "}":
			depth--
			if depth == scopeDepth-1 && scope != "" {
				scope, scopeDepth = "", -1
			}
			if depth == 0 {
				end = t.Line
			}
		}
		if end >= 0 {
			break
		}
	}
	if end < 0 {
		return "", false
	}
	src := strings.Split(source, "\n")
	first := tokens[start].Line
	if end > len(src) {
		return "", false
	}
	var out []string
	placed := map[string]bool{}
	hasShadow := false
	for n := first; n <= end; n++ {
		text := src[n-1]
		li := lines[n]
		if li != nil && li.first == "shadow" && li.depth == 1 {
			hasShadow = true
		}
		// An option line of a limit: at the zone's depth for its own,
		// one deeper in a scope's block.
		own := li != nil && li.depth == 1 && li.scope == "" && !li.open
		inScope := li != nil && li.depth == 2 && li.scope != ""
		if (own || inScope) && rateOptions[li.first] {
			sc := ""
			if inScope {
				sc = li.scope
			}
			c, ok := limits[sc]
			if !ok {
				out = append(out, text)
				continue
			}
			if !placed[sc] {
				placed[sc] = true
				indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]
				out = append(out, indent+"rate "+c.Rate)
				if c.Burst > 0 {
					out = append(out, indent+fmt.Sprintf("burst %d", c.Burst))
				}
			}
			continue
		}
		out = append(out, text)
	}
	if len(placed) != len(limits) {
		return "", false
	}
	if !hasShadow && len(out) > 1 {
		indent := out[1][:len(out[1])-len(strings.TrimLeft(out[1], " \t"))]
		out = slices.Insert(out, 1, indent+"shadow # watch it for a week, then remove this line")
	}
	// The block as it was indented, moved to the left margin.
	base := out[0][:len(out[0])-len(strings.TrimLeft(out[0], " \t"))]
	for i := range out {
		out[i] = strings.TrimPrefix(out[i], base)
	}
	return strings.Join(out, "\n"), true
}

// WriteText prints the recommendation for people.
func (rec *Recommendation) WriteText(w io.Writer) error {
	rec.Report.writeHeader(w)
	if len(rec.Limits) == 0 {
		fmt.Fprintln(w, "No request reached a replayed zone: nothing to measure.")
		return nil
	}
	for _, r := range rec.Limits {
		fmt.Fprintf(w, "%s (%s, configured %s): %d requests from %d keys\n", limitName(r.Zone, r.Scope), r.Algorithm, r.Configured, r.Requests, r.Keys)
		if r.Skipped != "" {
			fmt.Fprintf(w, "  not measured: %s\n\n", r.Skipped)
			continue
		}
		fmt.Fprintf(w, "  per key, most in any %s: %s\n", r.Window, r.Peaks.text())
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		buckets := bucketAlgorithm(r.Algorithm)
		head := "  RULE\tLIMIT\tWOULD DENY\tKEYS DENIED\tTOP-10 CLIENTS DENIED"
		if buckets {
			head += "\tBURST A KEY NEEDS (p99 / max)"
		}
		fmt.Fprintln(tw, head)
		for _, c := range r.Candidates {
			name := c.Rule
			if c.Chosen {
				name += " *"
			}
			top := "none"
			if len(c.TopDenied) > 0 {
				shown := make([]string, len(c.TopDenied))
				for i, k := range c.TopDenied {
					shown[i] = shownKey(k)
				}
				top = fmt.Sprintf("%d: %s", len(c.TopDenied), strings.Join(shown, ", "))
			}
			rate := c.Rate
			if c.Burst > 0 {
				rate += fmt.Sprintf(" burst %d", c.Burst)
			}
			line := fmt.Sprintf("  %s\t%s\t%d (%s)\t%d\t%s", name, rate, c.Denied, pct(c.Denied, r.Requests), c.DeniedKeys, top)
			if buckets {
				line += fmt.Sprintf("\t%d / %d", c.BurstNeeded.P99, c.BurstNeeded.Max)
			}
			fmt.Fprintln(tw, line)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	for _, b := range rec.Blocks {
		fmt.Fprintf(w, "Proposed (%s) for zone %s, to paste in place of it; shadow first:\n\n", rec.Rule, b.Zone)
		for _, line := range strings.Split(b.Text, "\n") {
			fmt.Fprintln(w, "    "+line)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func bucketAlgorithm(alg string) bool {
	return alg == "token_bucket" || alg == "gcra" || alg == "leaky_bucket"
}
