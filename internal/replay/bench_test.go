package replay_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/replay"
)

// benchCaddyfile is a two-zone config: per client on the API, and a
// global token bucket on everything.
const benchCaddyfile = `{
	auto_https off
}
:8080 {
	log {
		output file access.log
		format json
	}
	rate_limit {
		zone api {
			match {
				path /api/*
			}
			key {client_ip}
			rate 100/1m
		}
		zone site {
			key global
			rate 2000/1s
			algorithm token_bucket
		}
	}
	respond "ok"
}
`

// writeBenchLog writes n access log lines as Caddy writes them: a
// browser's headers, 1000 clients, 100 requests a second.
func writeBenchLog(tb testing.TB, path string, n int) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	start := int64(1_790_000_000) * 1e9
	for i := range n {
		ts := start + int64(i)*10e6
		client := fmt.Sprintf("198.51.%d.%d", i%7, (i*31)%1000%250)
		uri := fmt.Sprintf("/api/items/%d?page=%d", i%5000, i%7)
		if i%3 == 0 {
			uri = fmt.Sprintf("/static/app-%d.js", i%50)
		}
		fmt.Fprintf(w, `{"level":"info","ts":%d.%06d,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"%s","remote_port":"%d","client_ip":"%s","proto":"HTTP/1.1","method":"GET","host":"example.com","uri":"%s","headers":{"User-Agent":["Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"],"Accept":["text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"],"Accept-Language":["en-US,en;q=0.5"],"Accept-Encoding":["gzip, deflate, br"],"Referer":["https://example.com/"],"Connection":["keep-alive"],"Sec-Fetch-Mode":["navigate"]}},"bytes_read":0,"user_id":"","duration":0.000%06d,"size":2,"status":200,"resp_headers":{"Server":["Caddy"],"Content-Type":["text/plain; charset=utf-8"]}}`+"\n",
			ts/1e9, ts%1e9/1e3, client, 40000+i%20000, client, uri, 100+i%900)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	f.Close()
}

func benchPlan(tb testing.TB) *replay.Plan {
	tb.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(benchCaddyfile), nil)
	if err != nil {
		tb.Fatal(err)
	}
	plan, err := replay.PrepareConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return plan
}

// BenchmarkSimulate replays a 200,000-line log through a two-zone config
// and reports lines per minute and the process's peak RSS.
func BenchmarkSimulate(b *testing.B) {
	const lines = 200_000
	log := filepath.Join(b.TempDir(), "access.log")
	writeBenchLog(b, log, lines)
	plan := benchPlan(b)
	var before syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		res, err := replay.Replay(plan, plan.JSON, replay.Options{Logs: []string{log}}, false)
		if err != nil {
			b.Fatal(err)
		}
		if res.Entries != lines || res.Limit("api", "") == nil {
			b.Fatalf("replayed %d of %d lines", res.Entries, lines)
		}
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(lines)*float64(b.N)/elapsed.Minutes(), "lines/min")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(lines*b.N), "ns/line")
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		b.ReportMetric(float64(ru.Maxrss)/1024, "peak-RSS-MB")
		// CPU time, which a machine shared with other work does not
		// inflate the way it does the wall clock.
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(lines*b.N), "cpu-ns/line")
	}
}
