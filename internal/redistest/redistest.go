// Package redistest starts real Redis servers on free loopback ports for
// tests: a standalone server (with a password or not), a Redis Cluster of
// masters made by `redis-cli --cluster create`, and a Sentinel watching a
// master. Only tests import it.
//
// The servers are Redis's (redis-server, redis-cli) unless
// SLUICE_REDIS_SERVER=valkey picks Valkey's (valkey-server, valkey-cli),
// which take the same flags: every test that starts a server goes through
// this package, so the same tests run on either.
//
// Without the server installed, Need skips the test, loudly; with CI=true
// it fails the test instead, since CI installs both.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testport"
)

// FlavourEnv names the environment variable that picks the server.
const FlavourEnv = "SLUICE_REDIS_SERVER"

// Flavour is the server the tests start: "redis" (the default) or
// "valkey", from SLUICE_REDIS_SERVER; anything else is returned as given,
// and Need fails on it.
func Flavour() string {
	if f := os.Getenv(FlavourEnv); f != "" {
		return f
	}
	return "redis"
}

// Command is the server of the flavour run with args, not started, for a
// test that manages its process itself (on a port of its choosing, killed
// and started again).
func Command(args ...string) *exec.Cmd { return exec.Command(Flavour()+"-server", args...) }

// CLI is the command-line client of the flavour run with args.
func CLI(args ...string) *exec.Cmd { return exec.Command(Flavour()+"-cli", args...) }

// missing says why servers cannot be started, or "".
func missing() string {
	f := Flavour()
	if f != "redis" && f != "valkey" {
		return fmt.Sprintf("%s=%q: want redis or valkey", FlavourEnv, f)
	}
	for _, bin := range []string{f + "-server", f + "-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (CI=true: .ci/run installs it)"
		}
	}
	return ""
}

// Need skips the test when the server or its CLI is missing (fails it
// when CI=true, or when SLUICE_REDIS_SERVER names no known server).
func Need(t testing.TB) {
	t.Helper()
	if !Available(t) {
		t.SkipNow()
	}
}

// Available reports whether servers can be started, for a test whose
// Redis leg is one of several: it goes on without it, after logging why,
// except when CI=true (or SLUICE_REDIS_SERVER is wrong), where the test
// fails.
func Available(t testing.TB) bool {
	t.Helper()
	why := missing()
	if why == "" {
		return true
	}
	if f := Flavour(); (f != "redis" && f != "valkey") || os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Logf("SKIPPING Redis: %s; install Debian's redis-server and redis-tools (or valkey-server and valkey-tools) to run them", why)
	return false
}

// Server is one server process.
type Server struct {
	Addr     string // 127.0.0.1:port
	Password string // the --requirepass it was started with, if any
	Dir      string // its working directory, with its log in "log"
	cmd      *exec.Cmd
}

// Stop kills the server and waits for it; it may be called twice.
func (s *Server) Stop() {
	if s == nil || s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
	_ = os.RemoveAll(s.Dir)
}

// Log returns what the server wrote so far, for a failing test's output.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	return string(b)
}

// StartServer runs the server on a free port with args added, without
// persistence. conf, when not nil, makes a configuration file from the
// port (a Sentinel needs one it can rewrite) that the server reads first,
// and persistence is left to it. The caller stops the server; it also
// dies with the test process on Linux.
func StartServer(conf func(port int) string, args ...string) (*Server, error) {
	var last error
	for range 5 { // another process may take the port between the probe and the start
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "sluice-redis-")
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir}
		a := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir}, args...)
		for i := range args {
			if args[i] == "--requirepass" && i+1 < len(args) {
				s.Password = args[i+1]
			}
		}
		if conf != nil {
			file := filepath.Join(dir, "redis.conf")
			if err := os.WriteFile(file, []byte(conf(port)), 0o600); err != nil {
				return nil, err
			}
			a = append([]string{file}, a...)
		} else {
			a = append(a, "--save", "", "--appendonly", "no")
		}
		s.cmd = Command(a...)
		log, err := os.Create(filepath.Join(dir, "log"))
		if err != nil {
			return nil, err
		}
		s.cmd.Stdout, s.cmd.Stderr = log, log
		dieWithParent(s.cmd)
		err = s.cmd.Start()
		_ = log.Close()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		if last = waitPing(s.Addr, s.Password, 5*time.Second); last == nil {
			return s, nil
		}
		last = fmt.Errorf("%s on %s: %v: %s", s.cmd.Path, s.Addr, last, s.Log())
		s.Stop()
	}
	return nil, last
}

// FreePort returns a free loopback TCP port whose cluster bus port
// (port + 10000) is free too, both taken for this process alone (see
// internal/testport).
func FreePort() (int, error) {
	return testport.Free(1, true)
}

func waitPing(addr, password string, within time.Duration) error {
	c := goredis.NewClient(&goredis.Options{Addr: addr, Password: password, MaxRetries: -1})
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
		time.Sleep(20 * time.Millisecond) // polling a child process's start
	}
}

// StartCluster runs n redis-servers in cluster mode and joins them into a
// cluster of n masters without replicas, waiting until every node reports
// the cluster ok. On error, the servers started are stopped.
func StartCluster(n int) ([]*Server, error) {
	var nodes []*Server
	fail := func(err error) ([]*Server, error) {
		for _, s := range nodes {
			s.Stop()
		}
		return nil, err
	}
	var addrs []string
	for range n {
		s, err := StartServer(nil, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		if err != nil {
			return fail(err)
		}
		nodes = append(nodes, s)
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := CLI(args...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("%s --cluster create: %v: %s", Flavour()+"-cli", err, out))
	}
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
				return fail(fmt.Errorf("cluster not ok on %s: %v %s", a, err, info))
			}
			time.Sleep(50 * time.Millisecond) // polling the cluster's start
		}
		c.Close()
	}
	return nodes, nil
}

// StartSentinel runs a Sentinel that monitors master under masterName
// (quorum 1), and waits until it names the master's address.
func StartSentinel(master *Server, masterName string) (*Server, error) {
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		return nil, err
	}
	conf := "sentinel monitor " + masterName + " " + host + " " + port + " 1\n" +
		"sentinel down-after-milliseconds " + masterName + " 5000\n"
	if master.Password != "" {
		conf += "sentinel auth-pass " + masterName + " " + master.Password + "\n"
	}
	s, err := StartServer(func(int) string { return conf }, "--sentinel")
	if err != nil {
		return nil, err
	}
	c := goredis.NewSentinelClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.GetMasterAddrByName(context.Background(), masterName).Result()
		if err == nil && len(got) == 2 && net.JoinHostPort(got[0], got[1]) == master.Addr {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("sentinel on %s does not name %s as %q: %v %v", s.Addr, master.Addr, masterName, got, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the sentinel's start
	}
}

// Standalone starts a server for this test (stopped when it ends); a
// password, when not empty, is required of clients.
func Standalone(t testing.TB, password string) *Server {
	t.Helper()
	Need(t)
	var args []string
	if password != "" {
		args = []string{"--requirepass", password}
	}
	s, err := StartServer(nil, args...)
	if err != nil {
		t.Fatalf("starting %s-server: %v", Flavour(), err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Cluster starts a cluster of three masters for this test and returns
// their addresses.
func Cluster(t testing.TB) []string {
	t.Helper()
	Need(t)
	nodes, err := StartCluster(3)
	if err != nil {
		t.Fatalf("starting a redis cluster: %v", err)
	}
	addrs := make([]string, len(nodes))
	for i, s := range nodes {
		t.Cleanup(s.Stop)
		addrs[i] = s.Addr
	}
	return addrs
}

// Sentinel starts a master and a Sentinel that monitors it under
// masterName, for this test, and returns both.
func Sentinel(t testing.TB, masterName string) (master, sentinel *Server) {
	t.Helper()
	master = Standalone(t, "")
	sentinel, err := StartSentinel(master, masterName)
	if err != nil {
		t.Fatalf("starting a redis sentinel: %v", err)
	}
	t.Cleanup(sentinel.Stop)
	return master, sentinel
}
