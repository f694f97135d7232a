package replay

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// The page is one file: inline SVG and CSS, no script, font or image from
// anywhere, so it opens offline and can be mailed.

// Colors of the charts.
const (
	colorRequests = "#9aa5b1"
	colorDenied   = "#d62728"
	colorLimit    = "#1f77b4"
)

type pageLimit struct {
	Title      string
	ID         string
	Summary    string
	Timeline   template.HTML
	Dist       template.HTML
	DistNote   string
	TopDenied  []KeyCount
	Candidates []Candidate
	Requests   int64
	Caveats    []string
}

type page struct {
	Title  string
	Header []string
	Limits []pageLimit
	Blocks []ZoneBlock
}

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"pct": pct, "key": shownKey,
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{{.Title}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:32px;border-top:1px solid #ddd;padding-top:16px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}
th{font-weight:600}td:first-child,td:nth-child(2),.num{white-space:nowrap}.num{text-align:right}.chosen{font-weight:700}svg{display:block;margin:8px 0}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}.note{color:#8a5a00}
pre{background:#f6f6f6;padding:8px;overflow:auto}
</style></head><body>
<h1>{{.Title}}</h1>
{{range .Header}}<div>{{.}}</div>{{end}}
{{range .Limits}}
<h2 id="{{.ID}}">{{.Title}}</h2>
<div>{{.Summary}}</div>
{{range .Caveats}}<div class="note">Note: {{.}}</div>{{end}}
<div class="legend"><span style="background:` + colorRequests + `"></span>requests<span style="background:` + colorDenied + `"></span>would deny</div>
{{.Timeline}}
{{if .Dist}}<div>{{.DistNote}}</div>{{.Dist}}{{end}}
{{if .Candidates}}<table><tr><th>rule</th><th>limit</th><th class="num">would deny</th><th class="num">keys denied</th><th>top-10 clients denied</th></tr>
{{$req := .Requests}}{{range .Candidates}}<tr{{if .Chosen}} class="chosen"{{end}}><td>{{.Rule}}{{if .Chosen}} *{{end}}</td><td>{{.Rate}}</td><td class="num">{{.Denied}} ({{pct .Denied $req}})</td><td class="num">{{.DeniedKeys}}</td><td>{{range $i, $k := .TopDenied}}{{if $i}}, {{end}}{{key $k}}{{else}}none{{end}}</td></tr>
{{end}}</table>{{end}}
{{if .TopDenied}}<table><tr><th>most denied keys</th><th class="num">denied</th><th class="num">requests</th></tr>
{{range .TopDenied}}<tr><td>{{key .Key}}</td><td class="num">{{.Denied}}</td><td class="num">{{.Requests}}</td></tr>
{{end}}</table>{{end}}
{{end}}
{{range .Blocks}}<h2>Proposed zone {{.Zone}}</h2><pre>{{.Text}}</pre>{{end}}
</body></html>
`))

// WriteSimulateHTML writes the simulate report as one HTML page.
func WriteSimulateHTML(w io.Writer, rep *Report) error {
	p := page{Title: "Rate limit replay", Header: headerLines(rep)}
	for _, l := range rep.Limits {
		pl := pageLimit{
			Title: limitName(l.Zone, l.Scope), ID: chartID(l.Zone, l.Scope),
			Summary: fmt.Sprintf("%s, %s %s: %d requests, would deny %d (%s), %d keys, %d denied", l.Mode, l.Algorithm, l.Rate,
				l.Requests, l.Denied, pct(l.Denied, l.Requests), l.Keys, l.DeniedKeys),
			Timeline: timelineSVG(chartID(l.Zone, l.Scope), l.Timeline), TopDenied: l.TopDenied, Caveats: l.Caveats,
		}
		if l.PeakValues != nil {
			pl.Dist = distSVG(chartID(l.Zone, l.Scope), l.PeakValues, l.Limit, fmt.Sprintf("limit %d", l.Limit))
			pl.DistNote = fmt.Sprintf("Keys by the most they asked in any %s; the line is the configured limit.", FormatWindow(l.Window))
		}
		p.Limits = append(p.Limits, pl)
	}
	return pageTmpl.Execute(w, p)
}

// WriteRecommendHTML writes the recommendation as one HTML page.
func WriteRecommendHTML(w io.Writer, rec *Recommendation) error {
	p := page{Title: "Rate limit recommendation (" + rec.Rule + ")", Header: headerLines(rec.Report), Blocks: rec.Blocks}
	for _, r := range rec.Limits {
		id := chartID(r.Zone, r.Scope)
		pl := pageLimit{
			Title: limitName(r.Zone, r.Scope), ID: id, Requests: r.Requests,
			Summary:  fmt.Sprintf("%s, configured %s: %d requests from %d keys", r.Algorithm, r.Configured, r.Requests, r.Keys),
			Timeline: timelineSVG(id, r.Timeline), Candidates: r.Candidates,
		}
		if r.Skipped == "" {
			pl.Dist = distSVG(id, r.PeakValues, r.Proposed, fmt.Sprintf("proposed %d/%s", r.Proposed, r.Window))
			pl.DistNote = fmt.Sprintf("Keys by the most they asked in any %s (%s); the line is the proposed limit.", r.Window, r.Peaks.text())
		} else {
			pl.Caveats = []string{"not measured: " + r.Skipped}
		}
		p.Limits = append(p.Limits, pl)
	}
	return pageTmpl.Execute(w, p)
}

func headerLines(rep *Report) []string {
	var b strings.Builder
	rep.writeHeader(&b)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

func chartID(zone, scope string) string {
	id := "zone-" + zone
	if scope != "" {
		id += "-" + scope
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, id)
}

const chartW, chartH, padL, padB = 1000, 180, 60, 24

// timelineSVG draws requests (grey) and would-denies (red) per bin.
func timelineSVG(id string, t Timeline) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="timeline-%s" class="timeline" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="requests and would-denies over time">`, id, chartW, chartH, chartW, chartH)
	var most int64
	for _, n := range t.Requests {
		most = max(most, n)
	}
	n := len(t.Requests)
	plotW, plotH := float64(chartW-padL-10), float64(chartH-padB-10)
	if n > 0 && most > 0 {
		bw := plotW / float64(n)
		for i := range n {
			x := float64(padL) + float64(i)*bw
			for _, s := range []struct {
				v     int64
				color string
			}{{t.Requests[i], colorRequests}, {t.Denied[i], colorDenied}} {
				if s.v == 0 {
					continue
				}
				h := math.Max(plotH*float64(s.v)/float64(most), 1)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d</title></rect>`, x+0.5, 10+plotH-h, math.Max(bw-1, 1), h, s.color, s.v)
			}
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#444"/>`, padL, 10+plotH, chartW-10, 10+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="11" text-anchor="end">%d</text>`, padL-4, most)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">0</text>`, padL-4, chartH-padB)
	from := time.Unix(t.Start, 0).UTC()
	to := from.Add(time.Duration(t.BinSeconds*int64(n)) * time.Second)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">%s</text>`, padL, chartH-6, from.Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%s UTC</text>`, chartW-10, chartH-6, to.Format("2006-01-02 15:04"))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// distSVG draws how many keys reached each peak, with limit as a line.
func distSVG(id string, sorted []int64, limit int64, label string) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="distribution-%s" class="distribution" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="keys by their peak rate">`, id, chartW, chartH, chartW, chartH)
	top := limit
	if len(sorted) > 0 {
		top = max(top, sorted[len(sorted)-1])
	}
	top = max(top, 1)
	const bins = 50
	per := float64(top+1) / bins
	counts := make([]int64, bins)
	for _, v := range sorted {
		counts[min(int(float64(v)/per), bins-1)]++
	}
	var most int64
	for _, c := range counts {
		most = max(most, c)
	}
	plotW, plotH := float64(chartW-padL-10), float64(chartH-padB-10)
	bw := plotW / bins
	for i, c := range counts {
		if c == 0 {
			continue
		}
		// A square-root scale, so that the few busy keys next to
		// thousands of quiet ones still show.
		h := math.Max(plotH*math.Sqrt(float64(c))/math.Sqrt(float64(most)), 1)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d keys</title></rect>`, float64(padL)+float64(i)*bw+0.5, 10+plotH-h, math.Max(bw-1, 1), h, colorRequests, c)
	}
	lx := float64(padL) + plotW*float64(limit)/float64(top+1)
	fmt.Fprintf(&b, `<line class="limit" x1="%.1f" y1="10" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="3"/>`, lx, lx, 10+plotH, colorLimit)
	anchor, tx := "start", lx+6
	if lx > chartW/2 {
		anchor, tx = "end", lx-6
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="22" font-size="12" fill="%s" text-anchor="%s">%s</text>`, tx, colorLimit, anchor, template.HTMLEscapeString(label))
	fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#444"/>`, padL, 10+plotH, chartW-10, 10+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">0</text>`, padL, chartH-6)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%d</text>`, chartW-10, chartH-6, top)
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="11" text-anchor="end">%d keys</text>`, padL-4, most)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
