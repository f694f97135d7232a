package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// reservation is one request's units held in a key until the request is
// settled or its deadline passes.
type reservation struct {
	token    uint64
	deadline int64
	cost     int64
	granted  algorithms.Result
}

type resvKey struct {
	z   zoneOps
	key string
}

// reservations are a store's live reservations, by key. They expire
// lazily, as the Redis store's do: a key's due reservations are released
// before the key is decided again, and a pass over every key, once per
// reservation_ttl, drops those of keys nobody asks for any more.
type reservations struct {
	mu   sync.Mutex
	keys map[resvKey][]reservation
	// spare holds the lists of keys left without reservations, for the
	// next keys to reserve: a key is dropped as soon as it holds none
	// (a flood of keys must not pile up beside max_keys until the next
	// pass), and a busy key reserves without allocating.
	spare   [][]reservation
	sweepAt int64
}

// maxSpare bounds the lists kept for reuse.
const maxSpare = 64

// Decide is the store's decision (decide), with the reservations of the
// requests that ask for one (backend.Reserver): due ones of their keys
// are released first, and units an allowed decision takes are held.
func (s *Store) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	reserving := false
	for i := range reqs {
		reserving = reserving || reqs[i].Reserve > 0
	}
	if !reserving {
		return s.decide(ctx, reqs, out)
	}
	if err := s.expireDue(reqs, s.now()); err != nil {
		return false, err
	}
	ok, err := s.decide(ctx, reqs, out)
	if err != nil {
		return ok, err
	}
	s.resv.mu.Lock()
	defer s.resv.mu.Unlock()
	if s.resv.keys == nil {
		s.resv.keys = make(map[resvKey][]reservation)
	}
	for i, r := range reqs {
		if r.Reserve <= 0 {
			continue
		}
		k := resvKey{r.Limit.(zoneOps), r.Key}
		switch {
		case ok && out[i].Allowed && r.Cost > 0:
			live, held := s.resv.keys[k]
			if !held && len(s.resv.spare) > 0 {
				live = s.resv.spare[len(s.resv.spare)-1]
				s.resv.spare = s.resv.spare[:len(s.resv.spare)-1]
			}
			s.resv.keys[k] = append(live, reservation{token: r.Token, deadline: out[i].At + r.Reserve, cost: r.Cost, granted: out[i]})
		case !out[i].Allowed && out[i].RetryAfter != algorithms.Never:
			// A live reservation may come back before the window
			// ends: the client is told the sooner of the two.
			for _, v := range s.resv.keys[k] {
				if w := max(v.deadline-out[i].At, 1); w < out[i].RetryAfter {
					out[i].RetryAfter = w
				}
			}
		}
	}
	return ok, nil
}

// expireDue releases the reservations past their deadline of the keys of
// reqs, and of every key once per reservation_ttl.
func (s *Store) expireDue(reqs []backend.Request, now int64) error {
	var due []resvDue
	s.resv.mu.Lock()
	for _, r := range reqs {
		if r.Reserve <= 0 {
			continue
		}
		z, ok := r.Limit.(zoneOps)
		if !ok {
			s.resv.mu.Unlock()
			return fmt.Errorf("zone %q was not registered with the memory backend", r.Limit.Name())
		}
		due = s.resv.takeDue(resvKey{z, r.Key}, now, due, false)
		if now >= s.resv.sweepAt {
			s.resv.sweepAt = now + r.Reserve
			for k := range s.resv.keys {
				due = s.resv.takeDue(k, now, due, true)
			}
		}
	}
	s.resv.mu.Unlock()
	for _, d := range due {
		d.k.z.refund(d.k.z.hash(d.k.key), now, d.v.granted, d.v.cost)
	}
	return nil
}

type resvDue struct {
	k resvKey
	v reservation
}

// takeDue removes k's reservations due at now, appending them to due; a
// key left without any is dropped when drop is set (a key being decided
// keeps its room for the reservation it is about to hold). The caller
// holds rs.mu.
func (rs *reservations) takeDue(k resvKey, now int64, due []resvDue, drop bool) []resvDue {
	live, ok := rs.keys[k]
	if !ok {
		return due
	}
	n := 0
	for _, v := range live {
		if v.deadline <= now {
			due = append(due, resvDue{k, v})
			continue
		}
		live[n] = v
		n++
	}
	if n == 0 && drop {
		rs.put(k, live[:0])
	} else if n < len(live) {
		rs.keys[k] = live[:n]
	}
	return due
}

// put stores k's live reservations, dropping k when it holds none. The
// caller holds rs.mu.
func (rs *reservations) put(k resvKey, live []reservation) {
	if len(live) > 0 {
		rs.keys[k] = live
		return
	}
	delete(rs.keys, k)
	if len(rs.spare) < maxSpare {
		rs.spare = append(rs.spare, live[:0])
	}
}

// SettleReservations commits or releases the reservations of reqs (backend.Reserver).
// Only a reservation still held is released: one that expired, or was
// settled before, gives nothing back.
func (s *Store) SettleReservations(_ context.Context, reqs []backend.Request, granted []algorithms.Result, commit bool) error {
	now := s.now()
	for i, r := range reqs {
		z, ok := r.Limit.(zoneOps)
		if !ok {
			return fmt.Errorf("zone %q was not registered with the memory backend", r.Limit.Name())
		}
		s.settle(z, r, granted[i], commit, now)
	}
	return nil
}

// settle commits or releases r's reservation, made by the decision that
// granted it; a release refunds its units only if it was still held.
func (s *Store) settle(z zoneOps, r backend.Request, granted algorithms.Result, commit bool, now int64) {
	if r.Reserve <= 0 || r.Cost <= 0 || !granted.Allowed {
		return
	}
	k := resvKey{z, r.Key}
	s.resv.mu.Lock()
	live, found := s.resv.keys[k], false
	for j, v := range live {
		if v.token == r.Token && v.granted.At == granted.At {
			found = true
			live = append(live[:j], live[j+1:]...)
			break
		}
	}
	if found {
		s.resv.put(k, live)
	}
	s.resv.mu.Unlock()
	if found && !commit {
		z.refund(z.hash(r.Key), now, granted, r.Cost)
	}
}

// Interface guard.
var _ backend.Reserver = (*Store)(nil)
