package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// The placeholders of decided requests hold their numbers whether they are
// small (taken from a table made once) or large (converted per request),
// and a 429 is a Caddy error without an error ID or trace: error routes
// see the status and the zone, and {http.error.id} is empty.
func TestDecisionPlaceholdersSmallAndLarge(t *testing.T) {
	const numbers = `{"handler": "headers", "response": {"set": {
		"X-Zone": ["{http.rate_limit.zone}"],
		"X-Limit": ["{http.rate_limit.limit}"],
		"X-Remaining": ["{http.rate_limit.remaining}"],
		"X-Reset": ["{http.rate_limit.reset}"]}}}`
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"hotpath_numbers": {"key": "static", "cost": "{http.request.header.X-Cost}", "window": "2h", "max_events": 5000}}
	}, `+numbers+`, `+okHandler, `[{"handle": [{"handler": "static_response", "status_code": "{http.error.status_code}",
		"body": "id={http.error.id} trace={http.error.trace} zone={http.rate_limit.exceeded.name} key={http.rate_limit.exceeded.key} retry={http.rate_limit.exceeded.retry_after} remaining={http.rate_limit.remaining} limit={http.rate_limit.limit}"}]}]`), "json")

	for _, step := range []struct {
		cost, limit, remaining, reset string
	}{
		{"1", "5000", "4999", "7200"},   // beyond the table
		{"4000", "5000", "999", "7200"}, // a limit beyond it, a count within it
		{"999", "5000", "0", "7200"},
	} {
		req, _ := http.NewRequest("GET", httpBase+"/", nil)
		req.Header.Set("X-Cost", step.cost)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != http.StatusOK || h.Get("X-Zone") != "hotpath_numbers" || h.Get("X-Limit") != step.limit || h.Get("X-Remaining") != step.remaining || h.Get("X-Reset") != step.reset {
			t.Fatalf("cost %s: %d zone=%q limit=%q remaining=%q reset=%q; want 200 hotpath_numbers %s %s %s", step.cost, resp.StatusCode,
				h.Get("X-Zone"), h.Get("X-Limit"), h.Get("X-Remaining"), h.Get("X-Reset"), step.limit, step.remaining, step.reset)
		}
	}
	code, ra, body := do(t, tester, "GET", "/", "X-Cost", "1")
	const want = "id= trace= zone=hotpath_numbers key=static retry=7200 remaining=0 limit=5000"
	if code != http.StatusTooManyRequests || ra != "7200" || body != want {
		t.Fatalf("over the limit: %d, Retry-After %q, %q; want 429, 7200, %q", code, ra, body, want)
	}
}

// A query of more than 10,000 parameters is one Go (and so Caddy's
// placeholder) reads nothing of, while the application may read all of
// it: the key is still the parameter's value, never an absent key that
// "missing skip" would let through.
func TestQueryKeyBeyondGoParameterLimit(t *testing.T) {
	tester := newTester(t, jsonServer(`{
		"handler": "rate_limit",
		"rate_limits": {"hotpath_query": {"key": "{http.request.uri.query.user}", "missing": "skip", "window": "1h", "max_events": 1}}
	}, `+okHandler, ""), "json")
	// 10,000 empty pairs: Go counts the separators.
	padded := "/?" + strings.Repeat("&", 10000) + "user=victim"
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, _, _ := do(t, tester, "GET", padded); code != want {
			t.Fatalf("padded query #%d: status %d, want %d", i+1, code, want)
		}
	}
	expect429(t, tester, 3599, 3600, "GET", "/?user=victim")
	expectN(t, tester, 2, http.StatusOK, "GET", "/?other=1")
}

func init() { caddy.RegisterModule(new(slotStore)) }

// slotStore is the memory store, recording the slot each request it
// admits is given (when it was decided plus how long it must wait) and
// each slot given back. Queue tests assert these slots, which the store
// computes exactly, rather than when the server's goroutines happened to
// run, which a loaded machine delays by any amount.
type slotStore struct {
	backend.Store
}

func (*slotStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: backend.Namespace + ".sluice_test_slots", New: func() caddy.Module { return new(slotStore) }}
}

func (s *slotStore) Provision(ctx caddy.Context) error {
	mod, err := ctx.LoadModuleByID(backend.Namespace+".memory", nil)
	if err != nil {
		return err
	}
	s.Store = mod.(backend.Store)
	return nil
}

func (s *slotStore) Configure(setup backend.Setup) { s.Store.(backend.Configurable).Configure(setup) }

func (s *slotStore) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	allowed, err := s.Store.Decide(ctx, reqs, out)
	if err == nil {
		for i, req := range reqs {
			slots.record(req.Limit.Name(), out[i], allowed, false)
		}
	}
	return allowed, err
}

func (s *slotStore) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	err := s.Store.Refund(ctx, reqs, granted)
	for i, req := range reqs {
		slots.record(req.Limit.Name(), granted[i], true, true)
	}
	return err
}

// slots holds what slotStore saw, by zone.
var slots = slotLog{zones: map[string]*zoneSlots{}}

type slotLog struct {
	sync.Mutex
	zones map[string]*zoneSlots
}

// zoneSlots are what a zone decided, in Unix nanoseconds of the store's
// clock: when each request was decided, the slots it gave out (with the
// decision time and delay of each) and the slots given back.
type zoneSlots struct {
	decided     []int64
	granted, at []int64
	delays      []time.Duration
	refunded    []int64
}

func (l *slotLog) record(zone string, res algorithms.Result, allowed, refund bool) {
	l.Lock()
	defer l.Unlock()
	z := l.zones[zone]
	if z == nil {
		z = new(zoneSlots)
		l.zones[zone] = z
	}
	switch {
	case refund:
		z.refunded = append(z.refunded, res.At+res.Delay)
	case allowed:
		z.granted = append(z.granted, res.At+res.Delay)
		z.at = append(z.at, res.At)
		z.delays = append(z.delays, time.Duration(res.Delay))
		fallthrough
	default:
		z.decided = append(z.decided, res.At)
	}
}

func (l *slotLog) of(zone string) zoneSlots {
	l.Lock()
	defer l.Unlock()
	z := l.zones[zone]
	if z == nil {
		return zoneSlots{}
	}
	return zoneSlots{slices.Clone(z.decided), slices.Clone(z.granted), slices.Clone(z.at), slices.Clone(z.delays), slices.Clone(z.refunded)}
}

// released are the slots of the requests that were let through: those
// given out, less one of each given back.
func (z zoneSlots) released() []int64 {
	out := slices.Clone(z.granted)
	for _, back := range z.refunded {
		if i := slices.Index(out, back); i >= 0 {
			out = slices.Delete(out, i, i+1)
		}
	}
	slices.Sort(out)
	return out
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline: synchronisation without guessing how long the server takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var zoneRuns atomic.Int64

// freshZone is a zone name no earlier run of a test in this process used:
// zones of one name share their state, and a queue left full by one run
// would change the next (go test -count=20).
func freshZone(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, zoneRuns.Add(1))
}

// assertSpaced fails unless the slots are at least interval apart: a queue
// never lets two requests through at once.
func assertSpaced(t *testing.T, slots []int64, interval time.Duration) {
	t.Helper()
	for i := 1; i < len(slots); i++ {
		if gap := time.Duration(slots[i] - slots[i-1]); gap < interval {
			t.Fatalf("slots %d and %d are %v apart, want at least %v (slots: %v)", i, i+1, gap, interval, slots)
		}
	}
}

// assertNotBefore fails unless each response came no earlier than a slot
// of its own: in order, the k-th response at or after the k-th slot.
func assertNotBefore(t *testing.T, answered, slots []int64) {
	t.Helper()
	answered, slots = slices.Sorted(slices.Values(answered)), slices.Sorted(slices.Values(slots))
	if len(answered) > len(slots) {
		t.Fatalf("%d responses for %d slots", len(answered), len(slots))
	}
	for i := range answered {
		if answered[i] < slots[i] {
			t.Fatalf("response %d came %v before its slot", i+1, time.Duration(slots[i]-answered[i]))
		}
	}
}
