package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startUpstream serves h on a loopback port until the test ends and
// returns the server and its host:port, as a reverse_proxy names it.
func startUpstream(t *testing.T, h http.HandlerFunc) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, strings.TrimPrefix(srv.URL, "http://")
}

// inFlight counts the requests an upstream is serving at once and the
// most it ever served at once: a cap holds when the peak stays under it.
type inFlight struct {
	now, peak atomic.Int64
}

// enter counts a request in, raising the peak when it is a new high.
func (f *inFlight) enter() {
	n := f.now.Add(1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
}

// leave counts a request out.
func (f *inFlight) leave() { f.now.Add(-1) }

// sickUpstream is an upstream whose latency and failures the test sets
// while requests flow, and which counts the requests it serves at once.
type sickUpstream struct {
	*httptest.Server
	inFlight
	delay  atomic.Int64 // ns
	fail   atomic.Bool  // answer 502
	served atomic.Int64
}

func newSickUpstream(t *testing.T) *sickUpstream {
	u := new(sickUpstream)
	u.delay.Store(int64(5 * time.Millisecond))
	u.Server, _ = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.enter()
		defer u.leave()
		u.served.Add(1)
		select {
		case <-time.After(time.Duration(u.delay.Load())):
		case <-r.Context().Done():
			return
		}
		if u.fail.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	return u
}

// paidUpstream is a paid provider behind the proxy that answers what each
// request's X-Answer says: a status ("200", "502"), or "hang" to answer
// nothing until the proxy gives up on it. With X-Work (a duration), it
// works that long before it answers, whether the proxy is still waiting
// or not: the provider has the message once the request reached it, as a
// real one does. It counts the requests that reach it and the answers it
// finished, and signals each request that hangs.
type paidUpstream struct {
	addr     string
	hits     atomic.Int64
	answered atomic.Int64
	hanging  chan struct{}
	// hangEnded receives how long each hanging request was held before
	// the proxy gave up on it.
	hangEnded chan time.Duration
}

func newPaidUpstream(t *testing.T) *paidUpstream {
	u := &paidUpstream{hanging: make(chan struct{}, 16), hangEnded: make(chan time.Duration, 16)}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		defer u.answered.Add(1)
		answer := r.Header.Get("X-Answer")
		if answer == "hang" {
			start := time.Now()
			u.hanging <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			select {
			case u.hangEnded <- time.Since(start):
			default:
			}
			return
		}
		if d, err := time.ParseDuration(r.Header.Get("X-Work")); err == nil {
			time.Sleep(d)
		}
		code, _ := strconv.Atoi(answer)
		w.WriteHeader(code)
		fmt.Fprint(w, "sent")
	})
	return u
}

// countingUpstream counts the requests it is serving at once and the most
// it ever served at once. hold decides how long each request stays.
type countingUpstream struct {
	*httptest.Server
	inFlight
	hold func(r *http.Request)
}

func newCountingUpstream(t *testing.T, hold func(r *http.Request)) *countingUpstream {
	u := &countingUpstream{hold: hold}
	u.Server, _ = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.enter()
		u.hold(r)
		u.leave()
		_, _ = io.WriteString(w, "ok")
	})
	return u
}

// holdingUpstream holds a request sent with X-Hang until release is
// closed, signalling arrived when it gets there; others pass at once.
func holdingUpstream(t *testing.T) (*countingUpstream, chan struct{}, chan struct{}) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	u := newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			arrived <- struct{}{}
			<-release
		}
	})
	return u, arrived, release
}

// tokenUpstream is an LLM application: it answers with the tokens the
// request's X-Test-Used asks for, in X-Tokens-Used (as a header, or as a
// trailer when X-Test-Trailer is set), after noting how many tokens the
// admin API says the key has left while the request runs.
type tokenUpstream struct {
	addr   string
	during atomic.Int64
	hits   atomic.Int64
}

func newTokenUpstream(t *testing.T, inspect func() int64) *tokenUpstream {
	u := &tokenUpstream{}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if inspect != nil {
			u.during.Store(inspect())
		}
		used := r.Header.Get("X-Test-Used")
		if r.Header.Get("X-Test-Trailer") != "" {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, `{"choices": []}`)
			w.Header().Set("X-Tokens-Used", used)
			return
		}
		if used != "" {
			w.Header().Set("X-Tokens-Used", used)
		}
		fmt.Fprint(w, `{"choices": []}`)
	})
	return u
}

// heldTokenUpstream is an LLM application that holds every call it gets
// until release is closed, then answers it with X-Tokens-Used used: the
// calls let through are all in flight at once.
type heldTokenUpstream struct {
	addr    string
	used    string
	arrived atomic.Int64
	release chan struct{}
	// bodies are the sizes of the bodies the upstream got.
	mu     sync.Mutex
	bodies []int
}

func newHeldTokenUpstream(t *testing.T, used string) *heldTokenUpstream {
	u := &heldTokenUpstream{used: used, release: make(chan struct{})}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, int(n))
		u.mu.Unlock()
		u.arrived.Add(1)
		select {
		case <-u.release:
		case <-time.After(20 * time.Second):
		}
		w.Header().Set("X-Tokens-Used", u.used)
		fmt.Fprint(w, `{"choices": []}`)
	})
	return u
}

// loginUpstream is the application behind the proxy: X-Password "right"
// logs in (200), anything else is refused (401). It counts the requests
// that reach it, per answer.
type loginUpstream struct {
	addr        string
	right       atomic.Int64
	wrong       atomic.Int64
	gate        chan struct{} // when not nil, a wrong password waits for it to close
	arrivedOnce sync.Once
}

func newLoginUpstream(t *testing.T, gated bool) *loginUpstream {
	u := &loginUpstream{}
	if gated {
		u.gate = make(chan struct{})
	}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") == "right" {
			u.right.Add(1)
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, "welcome")
			return
		}
		u.wrong.Add(1)
		if u.gate != nil {
			<-u.gate
		}
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, "wrong password")
	})
	return u
}

func (u *loginUpstream) open() { u.arrivedOnce.Do(func() { close(u.gate) }) }

// bodyUpstream answers 200 to a body that contains ok and status
// otherwise, counting the requests that reach it.
func bodyUpstream(t *testing.T, ok string, status int) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	_, addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), ok) {
			fmt.Fprint(w, "ok")
			return
		}
		w.WriteHeader(status)
	})
	return addr, hits
}

// latencyUpstream answers after the delay the test sets.
func latencyUpstream(t *testing.T) (*countingUpstream, *atomic.Int64) {
	var delay atomic.Int64
	u := newCountingUpstream(t, func(*http.Request) {
		time.Sleep(time.Duration(delay.Load()))
	})
	return u, &delay
}

// hangingUpstream holds every request sent to it with X-Hang until
// letGo; hang sends n such requests to path through Caddy. The test must
// defer letGo: Caddy stops only once they are answered.
func hangingUpstream(t *testing.T) (u *countingUpstream, hang func(path string, n int), letGo func()) {
	release := make(chan struct{})
	u = newCountingUpstream(t, func(r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
	})
	var wg sync.WaitGroup
	var once sync.Once
	hang = func(path string, n int) {
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, httpBase+path, nil)
				req.Header.Set("X-Hang", "1")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			})
		}
	}
	return u, hang, func() {
		once.Do(func() { close(release) })
		wg.Wait()
	}
}

// slowUpstream answers each request with the status in X-Answer (200 when
// absent) after X-Sleep milliseconds, and signals each request it gets.
type slowUpstream struct {
	addr string
	got  chan struct{}
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{got: make(chan struct{}, 64)}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.got <- struct{}{}
		if ms, _ := strconv.Atoi(r.Header.Get("X-Sleep")); ms > 0 {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		code, _ := strconv.Atoi(r.Header.Get("X-Answer"))
		w.WriteHeader(max(code, http.StatusOK))
		fmt.Fprint(w, "sent")
	})
	return u
}

// recordingUpstream answers each request with status(r), counting them and
// noting when each arrived.
type recordingUpstream struct {
	addr  string
	hits  atomic.Int64
	mu    sync.Mutex
	times []time.Time
}

func newRecordingUpstream(t *testing.T, status func(r *http.Request, body string) int) *recordingUpstream {
	u := &recordingUpstream{}
	_, u.addr = startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.times = append(u.times, time.Now())
		u.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(status(r, string(body)))
		io.WriteString(w, "answered")
	})
	return u
}

func (u *recordingUpstream) last() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	var last time.Time
	for _, at := range u.times {
		if at.After(last) {
			last = at
		}
	}
	return last
}
