package redis

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// A log in format 1 (units per event, written by older versions) is
// rewritten in format 2 when loaded: the rewrite keeps the key's expiry,
// or a key converted by a denied decision and then left alone would stay
// in Redis for good.
func TestLogFormat1KeepsExpiry(t *testing.T) {
	client := standaloneClient(t)
	const sec = int64(1_764_460_800)
	clock := sec*1e9 + 500_000_000
	// Two events of 2 units, 10.25s and 5.5s before the clock.
	events := []struct {
		off   float64 // ns after the base second
		units uint32
	}{{250_000_000, 2}, {5_000_000_000, 2}}
	format1 := func() string {
		b := make([]byte, 26, 26+12*len(events))
		binary.LittleEndian.PutUint64(b[0:], math.Float64bits(float64(sec-10)))
		binary.LittleEndian.PutUint64(b[8:], math.Float64bits(4)) // units held
		b[16] = 1                                                 // format
		binary.LittleEndian.PutUint32(b[18:], 0)                  // pruned
		binary.LittleEndian.PutUint32(b[22:], uint32(len(events)))
		for _, e := range events {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.off))
			b = binary.LittleEndian.AppendUint32(b, e.units)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		cost int64
		want algorithms.Result
	}{
		// Needs 1 unit more: the first event must leave (60s - 10.25s).
		{"denied", 2, algorithms.Result{Allowed: false, Limit: 5, Remaining: 1, RetryAfter: 49_750_000_000}},
		{"allowed", 1, algorithms.Result{Allowed: true, Limit: 5, Remaining: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(client, Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second, NoCache: true,
				now: func() int64 { return clock }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			z := mustZone(t, s, "old", algorithms.NameSlidingWindow, policy(5, time.Minute))
			ctx := context.Background()
			key := z.(*zone).stateKey("k")
			if err := client.Set(ctx, key, format1(), 30*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			out := make([]algorithms.Result, 1)
			if _, err := s.Decide(ctx, []backend.Request{{Limit: z, Key: "k", Cost: tc.cost}}, out); err != nil {
				t.Fatal(err)
			}
			got := out[0]
			if got.Allowed != tc.want.Allowed || got.Limit != tc.want.Limit || got.Remaining != tc.want.Remaining ||
				(!got.Allowed && got.RetryAfter != tc.want.RetryAfter) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if ttl, err := client.PTTL(ctx, key).Result(); err != nil || ttl <= 0 {
				t.Fatalf("PTTL %v %v: the log lost its expiry", ttl, err)
			}
			if v, _ := client.GetRange(ctx, key, 16, 16).Result(); v != "\x02" {
				t.Fatalf("format %q, want 2", v)
			}
		})
	}
}
