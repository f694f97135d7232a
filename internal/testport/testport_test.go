package testport

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// A port once taken is not handed out again, neither to this process nor
// to another one, and a port something listens on is never handed out.
func TestTakenPortIsNotHandedOutAgain(t *testing.T) {
	if p := os.Getenv("TESTPORT_TRY"); p != "" { // the second process
		port, _ := strconv.Atoi(p)
		if take([]int{port}) {
			os.Exit(3)
		}
		os.Exit(0)
	}
	first, err := Free(2, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{first, first + 1, first + 10000, first + 10001} {
		if take([]int{p}) {
			t.Fatalf("port %d taken twice by one process", p)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestTakenPortIsNotHandedOutAgain$")
		cmd.Env = append(os.Environ(), "TESTPORT_TRY="+strconv.Itoa(p))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("port %d taken by a second process too: %v %s", p, err, out)
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if take([]int{l.Addr().(*net.TCPAddr).Port}) {
		t.Fatal("a port with a listener was handed out")
	}
}
