// Package testport hands the tests loopback ports that no other test
// process takes too.
//
// `make test` runs a dozen test processes at once (the integration shards,
// the Valkey leg, the packages), each starting Caddys and Redis servers on
// ports it picks. Seeing a port free is not enough: two processes can see
// the same port free before either listens on it, and since Caddy listens
// with SO_REUSEPORT both then share it, each answering the other's
// requests. So a port is taken by locking a file named after it, kept
// locked until the process exits (the kernel drops the lock then, even on
// a crash); a process finding the file locked picks another port.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var (
	mu   sync.Mutex
	held []*os.File // the locks of this process, open until it exits
)

// Free returns the first of n consecutive loopback ports, below the
// kernel's ephemeral range (an outgoing connection of the tests, to Redis
// or to Caddy itself, may take a port of that range as its local port
// before the server listens on it), free now and taken by no other test
// process. If pair is set, the n ports 10000 above them are taken too (a
// Redis Cluster node's bus port).
func Free(n int, pair bool) (int, error) {
	low, high := 10000, EphemeralLow()
	if pair {
		high -= 10000
	}
	if high > 65536-n {
		high = 65536 - n
	}
	if high-low < 100*n {
		return 0, fmt.Errorf("testport: no room below the ephemeral range (%d)", EphemeralLow())
	}
	for range 200 {
		first := low + rand.IntN(high-low-n)
		ports := make([]int, 0, 2*n)
		for p := first; p < first+n; p++ {
			ports = append(ports, p)
			if pair {
				ports = append(ports, p+10000)
			}
		}
		if take(ports) {
			return first, nil
		}
	}
	return 0, fmt.Errorf("testport: no %d free loopback ports found", n)
}

// take locks every port of ports and checks that nothing listens on it,
// or takes none.
func take(ports []int) bool {
	dir := filepath.Join(os.TempDir(), "sluice-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return false
	}
	var got []*os.File
	release := func() {
		for _, f := range got {
			f.Close() // closing drops the lock
		}
	}
	for _, p := range ports {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			release()
			return false
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			release()
			return false
		}
		got = append(got, f)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil { // something outside the tests listens there
			release()
			return false
		}
		l.Close()
	}
	mu.Lock()
	held = append(held, got...)
	mu.Unlock()
	return true
}

// EphemeralLow is the first port of the kernel's ephemeral range (Linux's
// default when it cannot be read): ports below it are never given to
// outgoing connections.
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	if f := strings.Fields(string(b)); len(f) == 2 {
		if p, err := strconv.Atoi(f[0]); err == nil {
			return p
		}
	}
	return 32768
}
