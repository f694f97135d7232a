package redis

import (
	"testing"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/admintest"
)

func TestAdminStandalone(t *testing.T) {
	s := newStore(t, standaloneClient(t))
	admintest.Run(t, s, func(t *testing.T, alg string, p algorithms.Policy) backend.Limit {
		return mustZone(t, s, t.Name(), alg, p)
	})
}

func TestAdminCluster(t *testing.T) {
	s := newStore(t, clusterClient(t))
	admintest.Run(t, s, func(t *testing.T, alg string, p algorithms.Policy) backend.Limit {
		return mustZone(t, s, t.Name(), alg, p)
	})
}
