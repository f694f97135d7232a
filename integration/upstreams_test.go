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

// sickUpstream is an upstream whose latency and failures the test sets
// while requests flow, and which counts the requests it serves at once.
type sickUpstream struct {
	*httptest.Server
	delay     atomic.Int64 // ns
	fail      atomic.Bool  // answer 502
	now, peak atomic.Int64
	served    atomic.Int64
}

func newSickUpstream(t *testing.T) *sickUpstream {
	u := new(sickUpstream)
	u.delay.Store(int64(5 * time.Millisecond))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.now.Add(1)
		for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
		}
		defer u.now.Add(-1)
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
	}))
	t.Cleanup(u.Close)
	return u
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
	srv *httptest.Server
	got chan struct{}
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{got: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *slowUpstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// paidUpstream is a paid provider behind the proxy that answers what each
// request's X-Answer says: a status ("200", "502"), or "hang" to answer
// nothing until the proxy gives up on it. With X-Work (a duration), it
// works that long before it answers, whether the proxy is still waiting
// or not: the provider has the message once the request reached it, as a
// real one does. It counts the requests that reach it and the answers it
// finished, and signals each request that hangs.
type paidUpstream struct {
	srv      *httptest.Server
	hits     atomic.Int64
	answered atomic.Int64
	hanging  chan struct{}
	// hangEnded receives how long each hanging request was held before
	// the proxy gave up on it.
	hangEnded chan time.Duration
}

func newPaidUpstream(t *testing.T) *paidUpstream {
	u := &paidUpstream{hanging: make(chan struct{}, 16), hangEnded: make(chan time.Duration, 16)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *paidUpstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// countingUpstream counts the requests it is serving at once and the most
// it ever served at once. hold decides how long each request stays.
type countingUpstream struct {
	*httptest.Server
	now, peak atomic.Int64
	hold      func(r *http.Request)
}

func newCountingUpstream(t *testing.T, hold func(r *http.Request)) *countingUpstream {
	u := &countingUpstream{hold: hold}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.now.Add(1)
		for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
		}
		u.hold(r)
		u.now.Add(-1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(srv.Close)
	u.addr = strings.TrimPrefix(srv.URL, "http://")
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(srv.Close)
	u.addr = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// loginUpstream is the application behind the proxy: X-Password "right"
// logs in (200), anything else is refused (401). It counts the requests
// that reach it, per answer.
type loginUpstream struct {
	srv         *httptest.Server
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
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *loginUpstream) open() { u.arrivedOnce.Do(func() { close(u.gate) }) }

// bodyUpstream answers 200 to a body that contains ok and status
// otherwise, counting the requests that reach it.
func bodyUpstream(t *testing.T, ok string, status int) (addr string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), ok) {
			fmt.Fprint(w, "ok")
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), hits
}

// recordingUpstream answers each request with status(r), counting them and
// noting when each arrived.
type recordingUpstream struct {
	srv   *httptest.Server
	hits  atomic.Int64
	mu    sync.Mutex
	times []time.Time
}

func newRecordingUpstream(t *testing.T, status func(r *http.Request, body string) int) *recordingUpstream {
	u := &recordingUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.times = append(u.times, time.Now())
		u.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(status(r, string(body)))
		io.WriteString(w, "answered")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *recordingUpstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

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

// latencyUpstream answers after the delay the test sets.
func latencyUpstream(t *testing.T) (*countingUpstream, *atomic.Int64) {
	var delay atomic.Int64
	u := newCountingUpstream(t, func(*http.Request) {
		time.Sleep(time.Duration(delay.Load()))
	})
	return u, &delay
}
