package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `# bench/peers.sh 3 s x 1 rounds
name	base	rps	cpu_us	redis_us	p99_ms	rss_mb	denied
caddy_plain	caddy_plain	40000	25.0	0.0	3.0	68.0	0.000
sluice_redis_allowed	caddy_plain	20000	40.0	15.0	8.0	70.0	0.000
nginx_plain	nginx_plain	90000	6.0	0.0	4.0	11.0	0.000
nginx_denied	nginx_plain	80000	6.0	0.0	7.0	11.0	1.000
`

func TestChartsFromPeersTSV(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "peers.tsv")
	if err := os.WriteFile(in, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, dir, false); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "peers-throughput.svg"))
	if err != nil {
		t.Fatal(err)
	}
	// Two limited rows (the plain servers are the ratios' bases): 0.50× and 0.89×.
	for _, want := range []string{"0.50×", "0.89×", "Sluice Redis, allowed", "nginx limit_req, denied"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("throughput chart lacks %q", want)
		}
	}
	if strings.Contains(string(svg), "Caddy, no limiter") {
		t.Error("throughput chart has a bar for a plain server, whose ratio is 1 by definition")
	}
	cpu, _ := os.ReadFile(filepath.Join(dir, "peers-cpu.svg"))
	if !strings.Contains(string(cpu), "40 + 15 µs Redis") {
		t.Error("CPU chart does not stack Redis's CPU on the server's")
	}
}

func TestChartRefusesBadRows(t *testing.T) {
	for name, text := range map[string]string{
		"short row":    "name\tbase\n" + "caddy_plain\tcaddy_plain\t1\n",
		"not a number": "h\n" + "caddy_plain\tcaddy_plain\tmany\t1\t0\t1\t1\t0\n",
		"no rows":      "# nothing\n",
		"missing base": "h\n" + "x\tcaddy_plain\t1\t1\t0\t1\t1\t0\n",
	} {
		dir := t.TempDir()
		in := filepath.Join(dir, "peers.tsv")
		if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := run(in, dir, false); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
