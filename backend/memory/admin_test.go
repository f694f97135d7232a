package memory

import (
	"testing"

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
