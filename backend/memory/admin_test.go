package memory

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/admintest"
)

func TestAdmin(t *testing.T) {
	s := newStore(t, newFakeClock())
	admintest.Run(t, s, func(t *testing.T, alg string, p algorithms.Policy) backend.Limit {
		return testZone(t, s, alg, p, 0)
	})
}

// TestAdminUnderTraffic: operators' operations run beside decisions on the
// same keys (go test -race), and never leave a key more than its quota.
func TestAdminUnderTraffic(t *testing.T) {
	c := newFakeClock()
	s := newStore(t, c)
	p := algorithms.Policy{Limit: 50, Window: int64(time.Minute)}
	for _, alg := range algorithms.Names() {
		l := testZone(t, s, alg, p, 0)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algorithms.Result, 1)
				for i := range 500 {
					key := fmt.Sprint("k", i%7)
					switch (g + i) % 4 {
					case 0:
						_, _ = s.Decide(context.Background(), []backend.Request{{Limit: l, Key: key, Cost: 3}}, out)
					case 1:
						_, _ = s.Grant(context.Background(), l, key, 2)
					case 2:
						if i%50 == 0 {
							_ = s.Reset(context.Background(), l, key)
						}
					default:
						if u, err := s.Inspect(context.Background(), l, key); err != nil || u.Remaining > u.Limit {
							t.Errorf("%s: %+v %v", alg, u, err)
						}
					}
				}
			}()
		}
		wg.Wait()
	}
}
