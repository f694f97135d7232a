package redis

import (
	"fmt"
	"os"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// Real Redis servers for the tests: one standalone server and one
// three-master cluster, each started once for the package on free ports
// and stopped by TestMain.

var (
	servers   []*redistest.Server
	serversMu sync.Mutex

	standaloneOnce sync.Once
	standaloneAddr string
	standaloneErr  error

	clusterOnce  sync.Once
	clusterAddrs []string
	clusterErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	serversMu.Lock()
	for _, s := range servers {
		s.Stop()
	}
	serversMu.Unlock()
	os.Exit(code)
}

// needRedis skips the test when Redis is not installed, loudly; in CI
// (CI=true) it fails instead, since CI installs it.
func needRedis(t testing.TB) { redistest.Need(t) }

func keep(s ...*redistest.Server) {
	serversMu.Lock()
	servers = append(servers, s...)
	serversMu.Unlock()
}

// startServer runs redis-server on a free port with args added, until
// TestMain ends.
func startServer(args ...string) (string, error) {
	return startProcess(nil, args...)
}

// startProcess runs redis-server on a free port; conf, when given, makes
// its configuration file from the port.
func startProcess(conf func(port int) string, args ...string) (string, error) {
	s, err := redistest.StartServer(conf, args...)
	if err != nil {
		return "", err
	}
	keep(s)
	return s.Addr, nil
}

// standalone returns the address of the package's standalone server.
func standalone(t testing.TB) string {
	t.Helper()
	needRedis(t)
	standaloneOnce.Do(func() { standaloneAddr, standaloneErr = startServer() })
	if standaloneErr != nil {
		t.Fatalf("starting redis-server: %v", standaloneErr)
	}
	return standaloneAddr
}

// cluster returns the addresses of the package's three-master cluster.
func cluster(t testing.TB) []string {
	t.Helper()
	needRedis(t)
	clusterOnce.Do(func() {
		nodes, err := redistest.StartCluster(3)
		keep(nodes...)
		for _, s := range nodes {
			clusterAddrs = append(clusterAddrs, s.Addr)
		}
		clusterErr = err
	})
	if clusterErr != nil {
		t.Fatalf("starting a redis cluster: %v", clusterErr)
	}
	return clusterAddrs
}

func standaloneClient(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: standalone(t), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return c
}

func clusterClient(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster(t), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return c
}

var prefixSeq struct {
	sync.Mutex
	n int
}

// uniquePrefix gives each test its own key space (and its own zone
// histories) on the shared servers.
func uniquePrefix(t testing.TB) string {
	prefixSeq.Lock()
	defer prefixSeq.Unlock()
	prefixSeq.n++
	return fmt.Sprintf("t%d-%d:", os.Getpid(), prefixSeq.n)
}
