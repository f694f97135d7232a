package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// oddKeys are client keys whose hash tag needs care: empty (the quota of
// requests that lack their key), starting with }, starting with NUL, with
// braces inside, and plain.
var oddKeys = []string{"", "}", "}x", "}x{", "\x00", "\x00}x", "\x00\x00", "{x}", "{", "x}y", "user{7}", "alice"}

// Every key Sluice keeps for one client key (each kind of state, the
// lock-out record, a budget's reservations, the concurrency slots) has one
// non-empty hash tag, so that one script may touch them all on a Redis
// Cluster; and two client keys never share a key.
func TestEveryKeyOfAClientSharesItsSlot(t *testing.T) {
	seen := map[string]string{}
	for _, key := range oddKeys {
		state := clientKey(zonePrefix("sluice:", "login", "", kindBucket), key)
		names := []string{state, reservationsKey(state)}
		for _, kind := range []byte{kindBucket, kindLog, kindWindow, kindCounter, kindLockout, kindSlots} {
			names = append(names, clientKey(zonePrefix("sluice:", "login", "", kind), key))
		}
		for _, n := range names {
			i := strings.IndexByte(n, '{')
			if j := strings.IndexByte(n[i+1:], '}'); j <= 0 {
				t.Errorf("key %q: %q has an empty hash tag", key, n)
			}
			if slotOf(n) != slotOf(state) {
				t.Errorf("key %q: %q is in slot %d, its state %q in %d", key, n, slotOf(n), state, slotOf(state))
			}
		}
		if other, ok := seen[state]; ok {
			t.Errorf("keys %q and %q share the state %q", key, other, state)
		}
		seen[state] = key
	}
}

// A key_prefix with a hash tag must close it around something: an open or
// empty tag would scatter one client's keys over the cluster's slots.
func TestKeyPrefixHashTag(t *testing.T) {
	for prefix, ok := range map[string]bool{
		"": true, "sluice:": true, "sluice{1}:": true, "a}b:": true, "{x}{": true,
		"sluice{": false, "sluice{}:": false, "{": false, "a{b": false,
	} {
		err := checkKeyPrefix(prefix)
		if (err == nil) != ok || err != nil && !strings.Contains(err.Error(), "key_prefix") {
			t.Errorf("key_prefix %q: %v, want accepted %v", prefix, err, ok)
		}
	}
	if _, err := New(standaloneClient(t), Options{KeyPrefix: "sluice{"}); err == nil || !strings.Contains(err.Error(), `key_prefix "sluice{"`) {
		t.Errorf("a store with key_prefix sluice{: %v, want refused naming key_prefix", err)
	}
}

// On a Redis Cluster, every operation works for every key: a budget's
// decision, commit and release, a lockout, the admin's inspect, grant,
// reset and lock-out inspect, and concurrency slots.
func TestClusterEveryOperationOnOddKeys(t *testing.T) {
	s, err := New(clusterClient(t), Options{KeyPrefix: uniquePrefix(t), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	budget, err := s.Register(backend.LimitConfig{Name: "odd_budget", Algorithm: algorithms.NameSlidingWindow, Policy: policy(2, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	login, err := s.Register(backend.LimitConfig{Name: "odd_login", Algorithm: algorithms.NameTokenBucket, Policy: policy(1, time.Hour), Lockout: loginSteps})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := s.RegisterSlots(backend.SlotConfig{Name: "odd_slots", Limit: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out := make([]algorithms.Result, 1)
	for i, key := range oddKeys {
		// A budget of 2: one reservation committed, one released, then
		// two more spend it.
		for _, commit := range []bool{true, false} {
			reqs := []backend.Request{{Limit: budget, Key: key, Cost: 1, Reserve: int64(time.Minute), Token: uint64(2*i + 1)}}
			if commit {
				reqs[0].Token--
			}
			if ok, err := s.Decide(ctx, reqs, out); !ok || err != nil {
				t.Fatalf("key %q: budget decision: %v %v", key, ok, err)
			}
			if err := s.SettleReservations(ctx, reqs, out, commit); err != nil {
				t.Fatalf("key %q: settle (commit %v): %v", key, commit, err)
			}
		}
		for n := range 2 {
			reqs := []backend.Request{{Limit: budget, Key: key, Cost: 1, Reserve: int64(time.Minute), Token: uint64(1000 + 2*i + n)}}
			ok, err := s.Decide(ctx, reqs, out)
			if err != nil || ok != (n == 0) {
				t.Fatalf("key %q: budget decision %d after a commit and a release: %v %v, want allowed only the first", key, n+1, ok, err)
			}
		}
		if u, err := s.Grant(ctx, budget, key, 1); err != nil || u.Remaining != 1 {
			t.Fatalf("key %q: grant: %+v %v, want 1 remaining", key, u, err)
		}
		if err := s.Reset(ctx, budget, key); err != nil {
			t.Fatalf("key %q: reset: %v", key, err)
		}
		if u, err := s.Inspect(ctx, budget, key); err != nil || u.Remaining != 2 {
			t.Fatalf("key %q: inspect after reset: %+v %v, want 2 remaining", key, u, err)
		}
		// A lockout: denied once, locked out, reset.
		for n := range 2 {
			if ok, err := s.Decide(ctx, []backend.Request{{Limit: login, Key: key, Cost: 1}}, out); err != nil || ok != (n == 0) {
				t.Fatalf("key %q: login %d: %v %v", key, n+1, ok, err)
			}
		}
		if st, wait, err := s.InspectLockout(ctx, login, key); err != nil || st.Level != 1 || wait <= 0 {
			t.Fatalf("key %q: lock-out %+v for %v, %v; want level 1", key, st, wait, err)
		}
		if err := s.Reset(ctx, login, key); err != nil {
			t.Fatalf("key %q: reset of a locked-out key: %v", key, err)
		}
		if st, _, err := s.InspectLockout(ctx, login, key); err != nil || st.Level != 0 {
			t.Fatalf("key %q: lock-out after reset %+v, %v; want none", key, st, err)
		}
		id, err := slots.Acquire(ctx, key)
		if err != nil || id == "" {
			t.Fatalf("key %q: slot: %q %v", key, id, err)
		}
		if again, err := slots.Acquire(ctx, key); err != nil || again != "" {
			t.Fatalf("key %q: second slot of 1: %q %v, want none", key, again, err)
		}
		if err := slots.Release(ctx, key, id); err != nil {
			t.Fatalf("key %q: release: %v", key, err)
		}
	}
}
