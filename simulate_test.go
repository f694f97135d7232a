package sluice

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sluicehq/sluice/internal/replay"
)

// A replay never sleeps: a leaky_bucket queue's waits and the tarpit's
// holds end at once, on the log's clock, and the queue still admits what
// it would live.
func TestReplayWaitsForNothing(t *testing.T) {
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`:80 {
	log
	rate_limit {
		zone queue {
			key global
			rate 1/1s
			algorithm leaky_bucket
			max_delay 3s
		}
		tarpit 30s
	}
	respond "ok"
}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := replay.PrepareConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 6 {
		lines = append(lines, fmt.Sprintf(`{"ts":1800000000.%03d,"logger":"http.log.access.log0","request":{"remote_ip":"10.0.0.1","remote_port":"1","client_ip":"10.0.0.1","proto":"HTTP/1.1","method":"GET","host":"h","uri":"/","headers":{}},"duration":0.0001,"status":200}`, i+1))
	}
	log := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := replay.Replay(plan, plan.JSON, replay.Options{Logs: []string{log}, Prepare: prepareReplay}, false)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	// One at once and three queued (1, 2 and 3 s), two denied: live,
	// their waits and holds would take over 6 s.
	if res.Passed != 4 || res.Refused[429] != 2 {
		t.Fatalf("passed %d refused %v", res.Passed, res.Refused)
	}
	if elapsed > 3*time.Second {
		t.Fatalf("the replay took %s: it waited", elapsed)
	}
}
