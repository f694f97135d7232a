package redis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Real Redis servers for the tests: one standalone server and one
// three-master cluster, each started once for the package on free ports
// and stopped by TestMain.

var (
	servers   []*exec.Cmd
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
	for _, c := range servers {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	serversMu.Unlock()
	os.Exit(code)
}

// needRedis skips the test when redis-server is not installed, loudly; in
// CI (CI=true) it fails instead, since CI installs it.
func needRedis(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("redis-server is not installed (CI=true: .ci/run installs it)")
	}
	t.Skip("SKIPPING: redis-server is not installed; install Debian's redis-server to run the Redis backend tests")
}

// freePort returns a TCP port that is free, and whose cluster bus port
// (port + 10000) is free too.
func freePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port+10000 > 65535 {
			continue
		}
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = b.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port pair found")
}

// startServer runs redis-server on a free port with args added; it retries
// when another process took the port first.
func startServer(args ...string) (string, error) {
	return startProcess(nil, args...)
}

// startProcess runs redis-server on a free port; conf, when given, makes
// its configuration file (written in the server's directory) from the
// port, and the server runs from that file first.
func startProcess(conf func(port int) string, args ...string) (string, error) {
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		dir, err := os.MkdirTemp("", "sluice-redis-")
		if err != nil {
			return "", err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		a := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir}, args...)
		if conf != nil {
			file := filepath.Join(dir, "redis.conf")
			if err := os.WriteFile(file, []byte(conf(port)), 0o600); err != nil {
				return "", err
			}
			a = append([]string{file}, a...)
		} else {
			a = append(a, "--save", "", "--appendonly", "no")
		}
		cmd := exec.Command("redis-server", a...)
		log, _ := os.Create(filepath.Join(dir, "log"))
		cmd.Stdout, cmd.Stderr = log, log
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			return "", err
		}
		serversMu.Lock()
		servers = append(servers, cmd)
		serversMu.Unlock()
		if last = waitPing(addr, args, 5*time.Second); last == nil {
			return addr, nil
		}
		_ = cmd.Process.Kill()
		out, _ := os.ReadFile(filepath.Join(dir, "log"))
		last = fmt.Errorf("%v: %s", last, out)
	}
	return "", last
}

func waitPing(addr string, args []string, within time.Duration) error {
	o := &goredis.Options{Addr: addr, MaxRetries: -1}
	for i := range args {
		if args[i] == "--requirepass" && i+1 < len(args) {
			o.Password = args[i+1]
		}
	}
	c := goredis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond) // polling a child process's start, not synchronising tests
	}
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
	clusterOnce.Do(func() { clusterAddrs, clusterErr = startCluster() })
	if clusterErr != nil {
		t.Fatalf("starting a redis cluster: %v", clusterErr)
	}
	return clusterAddrs
}

func startCluster() ([]string, error) {
	var addrs []string
	for range 3 {
		a, err := startServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	// Wait until every node agrees the cluster is up.
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return nil, fmt.Errorf("cluster not ok on %s: %v %s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond) // polling the cluster's start
		}
		c.Close()
	}
	return addrs, nil
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
