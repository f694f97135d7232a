// Command chart draws the SVG bar charts of BENCHMARKS.md from the TSV that
// bench/peers.sh writes: throughput as a ratio to the limiter's own plain
// server, CPU per request (the server's and Redis's, stacked) and p99
// latency, one bar per configuration.
//
//	go run ./bench/chart -in docs/img/peers.tsv -out docs/img
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// row is one configuration's medians.
type row struct {
	name, base string
	rps        float64
	cpuUS      float64 // server processes, per request
	redisUS    float64 // redis-server, per request
	p99MS      float64
	rssMB      float64
	denied     float64 // share of answers that were not 2xx
}

func main() {
	in := flag.String("in", "docs/img/peers.tsv", "the TSV bench/peers.sh wrote")
	out := flag.String("out", "docs/img", "directory of the SVG files")
	md := flag.Bool("md", false, "print the results as a Markdown table too (for BENCHMARKS.md)")
	flag.Parse()
	if err := run(*in, *out, *md); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out string, md bool) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, title, err := parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	byName := map[string]row{}
	for _, r := range rows {
		byName[r.name] = r
	}
	var ratio, cpu, p99 []bar
	for _, r := range rows {
		if r.name == r.base {
			continue
		}
		base, ok := byName[r.base]
		if !ok || base.rps == 0 {
			return fmt.Errorf("%s: its base %q has no throughput", r.name, r.base)
		}
		label := label(r.name)
		ratio = append(ratio, bar{label: label, parts: []float64{r.rps / base.rps}, text: fmt.Sprintf("%.2f×", r.rps/base.rps)})
		p99 = append(p99, bar{label: label, parts: []float64{r.p99MS}, text: fmt.Sprintf("%.2f ms", r.p99MS)})
	}
	for _, r := range rows {
		text := fmt.Sprintf("%.0f µs", r.cpuUS)
		parts := []float64{r.cpuUS}
		if strings.Contains(r.name, "redis") {
			parts = append(parts, r.redisUS)
			text = fmt.Sprintf("%.0f + %.0f µs Redis", r.cpuUS, r.redisUS)
		}
		cpu = append(cpu, bar{label: label(r.name), parts: parts, text: text})
	}
	charts := []struct {
		file, heading string
		bars          []bar
		mark          float64 // a reference line (0: none)
	}{
		{"peers-throughput.svg", "Throughput, as a ratio to the same server without a limiter", ratio, 1},
		{"peers-cpu.svg", "CPU per request (µs): the server, and Redis where it is used", cpu, 0},
		{"peers-p99.svg", "p99 latency (ms), 32 connections", p99, 0},
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if md {
		table(os.Stdout, rows, byName)
	}
	for _, c := range charts {
		var b strings.Builder
		draw(&b, c.heading, title, c.bars, c.mark)
		if err := os.WriteFile(filepath.Join(out, c.file), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// parse reads the TSV: '#' lines (the first is the run's description),
// a header line, then one row per configuration.
func parse(r io.Reader) ([]row, string, error) {
	var rows []row
	var title string
	header := true
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			if title == "" {
				title = strings.TrimSpace(strings.TrimPrefix(line, "#"))
			}
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		if header {
			header = false
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 8 {
			return nil, "", fmt.Errorf("line %d: %d fields, want 8", n, len(f))
		}
		nums := make([]float64, 6)
		for i := range nums {
			v, err := strconv.ParseFloat(f[2+i], 64)
			if err != nil {
				return nil, "", fmt.Errorf("line %d, field %d: %w", n, 3+i, err)
			}
			nums[i] = v
		}
		rows = append(rows, row{f[0], f[1], nums[0], nums[1], nums[2], nums[3], nums[4], nums[5]})
	}
	if err := sc.Err(); err != nil {
		return nil, "", err
	}
	if len(rows) == 0 {
		return nil, "", fmt.Errorf("no rows")
	}
	return rows, title, nil
}

// table writes the rows as a Markdown table: the figures, and throughput
// and CPU as ratios to the row's plain server.
func table(w io.Writer, rows []row, byName map[string]row) {
	fmt.Fprintln(w, "| | requests/s | × plain | CPU per request | × plain | p99 | peak RSS | refused |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		base := byName[r.base]
		cpu := r.cpuUS + r.redisUS
		cpuText := fmt.Sprintf("%.1f µs", cpu)
		if strings.Contains(r.name, "redis") {
			cpuText = fmt.Sprintf("%.1f µs (Redis %.1f)", cpu, r.redisUS)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %s | %.2f | %.2f ms | %.0f MB | %.1f%% |\n",
			label(r.name), r.rps, r.rps/base.rps, cpuText, cpu/(base.cpuUS+base.redisUS), r.p99MS, r.rssMB, r.denied*100)
	}
}

// label turns a configuration's name into what a reader calls it.
func label(name string) string {
	words := map[string]string{
		"caddy_plain":           "Caddy, no limiter",
		"nginx_plain":           "nginx, no limiter",
		"mholt_allowed":         "mholt/caddy-ratelimit, allowed",
		"mholt_denied":          "mholt/caddy-ratelimit, denied",
		"sluice_memory_allowed": "Sluice memory, allowed",
		"sluice_memory_denied":  "Sluice memory, denied",
		"sluice_redis_allowed":  "Sluice Redis, allowed",
		"sluice_redis_denied":   "Sluice Redis, denied",
		"nginx_allowed":         "nginx limit_req, allowed",
		"nginx_denied":          "nginx limit_req, denied",
	}
	if w, ok := words[name]; ok {
		return w
	}
	return name
}

// bar is one horizontal bar, of one or more stacked parts.
type bar struct {
	label string
	parts []float64
	text  string
}

var colors = []string{"#3b6ea5", "#d9822b"}

func draw(w io.Writer, heading, subtitle string, bars []bar, mark float64) {
	const (
		labelW = 250
		plotW  = 360
		textW  = 150
		rowH   = 26
		top    = 56
	)
	max := mark
	for _, b := range bars {
		sum := 0.0
		for _, p := range b.parts {
			sum += p
		}
		max = math.Max(max, sum)
	}
	if max == 0 {
		max = 1
	}
	width := labelW + plotW + textW
	height := top + rowH*len(bars) + 16
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	fmt.Fprintf(w, `<text x="8" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(heading))
	fmt.Fprintf(w, `<text x="8" y="40" font-size="11" fill="#555">%s</text>`+"\n", html.EscapeString(subtitle))
	for i, b := range bars {
		y := top + i*rowH
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y+16, html.EscapeString(b.label))
		x := float64(labelW)
		for j, p := range b.parts {
			bw := p / max * plotW
			fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x, y+4, bw, rowH-8, colors[j%len(colors)])
			x += bw
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%s</text>`+"\n", x+6, y+16, html.EscapeString(b.text))
	}
	if mark > 0 {
		x := labelW + mark/max*plotW
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888" stroke-dasharray="4 3"/>`+"\n", x, top, x, top+rowH*len(bars))
	}
	fmt.Fprintln(w, "</svg>")
}
