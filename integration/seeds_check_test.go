package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/sluicehq/sluice/internal/redistest"
)

const recipeSecret = "an-example-secret-of-32-bytes!!!"

// recipeSite is the Caddyfile of docs/recipes.md that contains marker, made
// to run here; with addr, it proxies to addr instead of answering "ok".
func recipeSite(t *testing.T, marker, addr string) string {
	t.Helper()
	t.Setenv("SLUICE_KEY_SECRET", recipeSecret)
	site := docSite(t, "../docs/recipes.md", marker)
	if addr != "" {
		site = strings.ReplaceAll(site, `respond "ok"`, "reverse_proxy "+addr)
	}
	return site
}

// postFull posts body and returns the whole answer.
func postFull(t *testing.T, tester *caddytest.Tester, path, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest("POST", httpBase+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(out)}
}

// wantStatus fails unless r has status code and, when lo > 0, a
// Retry-After in [lo, hi] seconds.
func wantStatus(t *testing.T, what string, r response, code, lo, hi int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: %d %q, want %d", what, r.code, r.body, code)
	}
	if lo == 0 {
		return
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < lo || ra > hi {
		t.Fatalf("%s: Retry-After %q, want [%d, %d]", what, r.header.Get("Retry-After"), lo, hi)
	}
}

// noRateLimitFields fails if r tells the client anything of its quota.
func noRateLimitFields(t *testing.T, what string, r response) {
	t.Helper()
	for name := range r.header {
		if strings.Contains(strings.ToLower(name), "ratelimit") {
			t.Fatalf("%s: %s: %q sent on a zone with headers none", what, name, r.header.Get(name))
		}
	}
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

// Five tries per challenge, twenty per address, and nothing that tells a
// guesser how many tries are left.
func TestDocsRecipeOTPVerify(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone otp_verify {", ""), "caddyfile")
	try := func(challenge string) response {
		return postFull(t, tester, "/otp/verify", `{"challenge":"`+challenge+`","code":"123456"}`)
	}
	for i := range 5 {
		r := try("c1")
		wantStatus(t, fmt.Sprintf("try #%d of c1", i+1), r, 200, 0, 0)
		noRateLimitFields(t, "an allowed try", r)
	}
	r := try("c1")
	wantStatus(t, "6th try of c1", r, 429, 599, 600)
	noRateLimitFields(t, "a denied try", r)
	for _, c := range []string{"c2", "c3", "c4"} {
		for i := range 5 {
			wantStatus(t, fmt.Sprintf("try #%d of %s", i+1, c), try(c), 200, 0, 0)
		}
	}
	wantStatus(t, "21st try of the address", try("c5"), 429, 590, 600)
	wantStatus(t, "no challenge", postFull(t, tester, "/otp/verify/", `{"code":"123456"}`), 400, 0, 0)
}

// A user's bucket of 20 at 60 a minute, and 120 a minute per address for
// everyone; anonymous requests skip the user limit and see only the
// address's in RateLimit-Policy.
func TestDocsRecipeSearch(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone search {", ""), "caddyfile")
	start := time.Now()
	untilDenied := func(header ...string) (int, response) {
		for n := 0; n < 400; n++ {
			if r := fetch(t, tester, "GET", "/search?q=rak", header...); r.code != 200 {
				return n, r
			}
		}
		t.Fatal("never denied")
		return 0, response{}
	}
	userA := []string{"Authorization", "Bearer alice"}
	n, r := untilDenied(userA...)
	elapsed := time.Since(start).Seconds()
	// 20 at once, then one a second of refill.
	if n < 20 || float64(n) > 20+elapsed+1 {
		t.Fatalf("user allowed %d before a denial in %.1fs, want 20 plus the refill", n, elapsed)
	}
	wantStatus(t, "user over the burst", r, 429, 1, 1)
	rb := fetch(t, tester, "GET", "/search/?q=k", "Authorization", "Bearer bob")
	if rb.code != 200 || !strings.Contains(rb.header.Get("RateLimit-Policy"), `"search";q=20;w=20`) {
		t.Fatalf("another user: %d, RateLimit-Policy %q", rb.code, rb.header.Get("RateLimit-Policy"))
	}
	m, r := untilDenied()
	elapsed = time.Since(start).Seconds()
	// The address counted the user's n and bob's 1: 120 in all, plus two
	// a second of refill.
	if total := n + 1 + m; total < 120 || float64(total) > 120+2*elapsed+1 {
		t.Fatalf("the address allowed %d in %.1fs, want 120 plus the refill", total, elapsed)
	}
	wantStatus(t, "anonymous over the address's limit", r, 429, 1, 1)
	if got := r.header.Get("RateLimit-Policy"); got != `"search.ip";q=120;w=60` {
		t.Fatalf("anonymous RateLimit-Policy %q, want the address's limit alone", got)
	}
}

// upload declares a file of size bytes (or a chunked one) and sends no
// body: any answer is decided from the headers alone.
func upload(t *testing.T, auth string, size int64, chunked bool) response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	length := "Content-Length: " + strconv.FormatInt(size, 10)
	if chunked {
		length = "Transfer-Encoding: chunked"
	}
	fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: localhost\r\nAuthorization: %s\r\nContent-Type: application/octet-stream\r\n%s\r\nConnection: close\r\n\r\n", auth, length)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("upload of %d bytes: no answer before the body was sent: %v", size, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(body)}
}

// Ten 50 MiB files pass; the eleventh is refused before its body is sent,
// and told to wait for the bytes (8,641 s), not the count (3,600 s). Files
// over 50 MiB and chunked uploads are refused without counting.
func TestDocsRecipeUploads(t *testing.T) {
	newTester(t, recipeSite(t, "zone uploads {", ""), "caddyfile")
	const mib = 1 << 20
	for i := range 10 {
		wantStatus(t, fmt.Sprintf("upload #%d", i+1), upload(t, "Bearer u1", 50*mib, false), 200, 0, 0)
	}
	r := upload(t, "Bearer u1", 50*mib, false)
	wantStatus(t, "11th upload", r, 429, 8630, 8641)
	if !strings.Contains(r.body, `"code":"rate_limit_exceeded"`) {
		t.Fatalf("11th upload: body %q", r.body)
	}
	wantStatus(t, "60 MiB file", upload(t, "Bearer u2", 60*mib, false), 413, 0, 0)
	wantStatus(t, "chunked upload", upload(t, "Bearer u2", 0, true), 411, 0, 0)
	wantStatus(t, "50 MiB + 1 byte", upload(t, "Bearer u2", 50*mib+1, false), 413, 0, 0)
	// None of those counted: u2 still has its 10.
	for i := range 10 {
		wantStatus(t, fmt.Sprintf("u2 upload #%d", i+1), upload(t, "Bearer u2", 1024, false), 200, 0, 0)
	}
	wantStatus(t, "u2's 11th upload", upload(t, "Bearer u2", 1024, false), 429, 3599, 3600)
	wantStatus(t, "no user", upload(t, "", 1024, false), 400, 0, 0)
}

// awaitContinue sends the headers of an upload the way curl does for a
// large file (keep-alive, Expect: 100-continue) and waits for the server's
// go-ahead without sending a byte of the body. It returns the final answer
// and how long it took, or fails if the answer needs the body first.
func awaitContinue(t *testing.T, auth string, size int64, chunked bool) (r response, closed bool, took time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(httpBase, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	length := "Content-Length: " + strconv.FormatInt(size, 10)
	if chunked {
		length = "Transfer-Encoding: chunked"
	}
	start := time.Now()
	fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: localhost\r\nAuthorization: %s\r\nContent-Type: application/octet-stream\r\n%s\r\nExpect: 100-continue\r\n\r\n", auth, length)
	// A client gives up waiting after a while and sends the body anyway
	// (curl: 1 s by default); this one waits longer than a busy machine
	// needs to answer, and never sends it.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("upload of %d bytes waiting for 100 Continue: no answer without the body after %v: %v", size, time.Since(start).Round(time.Millisecond), err)
	}
	if resp.StatusCode == http.StatusContinue {
		t.Fatalf("upload of %d bytes: the server asked for the body (100 Continue)", size)
	}
	took = time.Since(start)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return response{resp.StatusCode, resp.Header, string(body)}, resp.Close, took
}

// A client that waits for 100 Continue before it sends its file gets every
// refusal at once, without being asked for the body, and the connection
// is closed rather than read: the refused upload costs no bandwidth.
func TestDocsRecipeUploadsRefusedBeforeContinue(t *testing.T) {
	newTester(t, recipeSite(t, "zone uploads {", ""), "caddyfile")
	const mib = 1 << 20
	for i := range 10 {
		wantStatus(t, fmt.Sprintf("upload #%d", i+1), upload(t, "Bearer u1", 50*mib, false), 200, 0, 0)
	}
	for _, c := range []struct {
		name    string
		auth    string
		size    int64
		chunked bool
		status  int
	}{
		{"the 11th upload", "Bearer u1", 50 * mib, false, 429},
		{"a 60 MiB file", "Bearer u2", 60 * mib, false, 413},
		{"a chunked upload", "Bearer u2", 0, true, 411},
		{"no user", "", 1024, false, 400},
	} {
		r, closed, took := awaitContinue(t, c.auth, c.size, c.chunked)
		wantStatus(t, c.name, r, c.status, 0, 0)
		if !closed {
			t.Errorf("%s: the connection stays open (Connection: close wanted: the body is not)", c.name)
		}
		t.Logf("%s: %d in %v", c.name, r.code, took.Round(time.Microsecond))
	}
}

// Per user 5 per 5 minutes, per card 3 declines an hour whoever tries it,
// per address 10 an hour.
func TestDocsRecipePayment(t *testing.T) {
	const declined = "4000000000000002"
	u := newRecordingUpstream(t, func(_ *http.Request, body string) int {
		if strings.Contains(body, declined) {
			return http.StatusPaymentRequired
		}
		return http.StatusOK
	})
	tester := newTester(t, recipeSite(t, "zone payment_card {", u.addr()), "caddyfile")
	pay := func(user, card string) response {
		r := postFull(t, tester, "/payments", `{"amount":100,"card":{"number":"`+card+`"}}`, "Authorization", "Bearer "+user)
		noRateLimitFields(t, "a payment", r)
		return r
	}
	for i := range 5 {
		wantStatus(t, fmt.Sprintf("u1 payment #%d", i+1), pay("u1", "4242424242424242"), 200, 0, 0)
	}
	before := u.hits.Load()
	wantStatus(t, "u1's 6th payment", pay("u1", "4242424242424242"), 429, 299, 300)
	for _, user := range []string{"u2", "u3", "u4"} {
		wantStatus(t, user+" with the declined card", pay(user, declined), 402, 0, 0)
	}
	wantStatus(t, "a 4th user with the declined card", pay("u5", declined), 429, 3599, 3600)
	if got := u.hits.Load() - before; got != 3 {
		t.Fatalf("the application saw %d of the refused and declined payments, want the 3 declines", got)
	}
	wantStatus(t, "u5 with a good card", pay("u5", "5555555555554444"), 200, 0, 0)
	wantStatus(t, "u6 with a good card", pay("u6", "5555555555554444"), 200, 0, 0)
	wantStatus(t, "the address's 11th attempt", pay("u7", "5555555555554444"), 429, 3590, 3600)
}

// A sender outside the provider's ranges gets 5 a minute; the provider's
// senders share a generous ceiling.
func TestDocsRecipeWebhooks(t *testing.T) {
	site := recipeSite(t, "zone webhooks_unknown {", "")
	tester := newTester(t, site, "caddyfile")
	for i := range 5 {
		wantStatus(t, fmt.Sprintf("unknown sender's callback #%d", i+1), postFull(t, tester, "/webhooks/pay", `{}`), 200, 0, 0)
	}
	wantStatus(t, "unknown sender's 6th callback", postFull(t, tester, "/webhooks/pay", `{}`), 429, 59, 60)

	tester = newTester(t, strings.ReplaceAll(site, "203.0.113.0/24", "127.0.0.1/32"), "caddyfile")
	for i := range 50 {
		wantStatus(t, fmt.Sprintf("provider's callback #%d", i+1), postFull(t, tester, "/webhooks/pay", `{}`), 200, 0, 0)
	}
}

// 40 a second evenly, 30 a minute per user, and a daily budget that counts
// only the calls the provider answered.
func TestDocsRecipeThirdParty(t *testing.T) {
	u := newRecordingUpstream(t, func(r *http.Request, _ string) int {
		if r.URL.Query().Get("fail") != "" {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	site := strings.Replace(recipeSite(t, "zone places_qps {", ""), "reverse_proxy https://maps.googleapis.com", "reverse_proxy "+u.addr(), 1)
	tester := newTester(t, site, "caddyfile")
	start := time.Now()
	var wg sync.WaitGroup
	codes := make(chan int, 40)
	for i := range 40 {
		wg.Go(func() {
			codes <- fetch(t, tester, "GET", "/maps/api/place?q=x", "X-User-Id", "u"+strconv.Itoa(i%4)).code
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("a call of the 40: %d, want every one queued and answered", c)
		}
	}
	if spread := u.last().Sub(start); spread < 975*time.Millisecond {
		t.Fatalf("the provider saw 40 calls within %v, want at least 975ms (one per 25ms)", spread)
	}
	daily := func() int64 {
		ls := keyOp(t, "GET", "/rate_limit/zones/places_daily/keys/places")
		return ls[0].Remaining
	}
	if got := daily(); got != 10000-40 {
		t.Fatalf("daily budget: %d left, want %d", got, 10000-40)
	}
	wantStatus(t, "a call the provider fails", fetch(t, tester, "GET", "/maps/api/place?fail=1", "X-User-Id", "u9"), 500, 0, 0)
	if got := daily(); got != 10000-40 {
		t.Fatalf("daily budget after a failed call: %d left, want %d", got, 10000-40)
	}
	for i := range 29 {
		wantStatus(t, fmt.Sprintf("u9 call #%d", i+2), fetch(t, tester, "GET", "/maps/api/place?q=y", "X-User-Id", "u9"), 200, 0, 0)
	}
	wantStatus(t, "u9's 31st call", fetch(t, tester, "GET", "/maps/api/place?q=y", "X-User-Id", "u9"), 429, 59, 60)
	if got := daily(); got != 10000-40-29 {
		t.Fatalf("daily budget: %d left, want %d", got, 10000-40-29)
	}
}

// Twenty streams of one key at once; the 21st is refused with 503 while
// another key passes; the day's budget settles at the tokens used.
func TestDocsRecipeLLM(t *testing.T) {
	release := make(chan struct{})
	var streaming atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") == "Bearer a" {
			streaming.Add(1)
			<-release
		}
		w.Header().Set("X-Tokens-Used", "1800")
		io.WriteString(w, "answer")
	}))
	t.Cleanup(srv.Close)
	tester := newTester(t, recipeSite(t, "scope daily_spend {", strings.TrimPrefix(srv.URL, "http://")), "caddyfile")
	const body = `{"max_tokens":4000}`
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			codes <- postFull(t, tester, "/v1/chat/completions", body, "Authorization", "Bearer a").code
		})
	}
	eventually(t, "20 streams at the upstream", func() bool { return streaming.Load() == 20 })
	r := postFull(t, tester, "/v1/chat/completions", body, "Authorization", "Bearer a")
	close(release)
	wg.Wait()
	close(codes)
	wantStatus(t, "21st stream of one key", r, 503, 1, 1)
	for c := range codes {
		if c != 200 {
			t.Fatalf("one of the 20 streams: %d", c)
		}
	}
	wantStatus(t, "another key", postFull(t, tester, "/v1/chat/completions", body, "Authorization", "Bearer b"), 200, 0, 0)
	ls := keyOp(t, "GET", "/rate_limit/zones/llm/keys/Bearer%20b?scope=daily_spend")
	if len(ls) != 1 || ls[0].Remaining != 10_000_000-1800 {
		t.Fatalf("daily spend of key b: %+v, want %d left", ls, 10_000_000-1800)
	}
}

// A known tool is refused at once; a client over 60 a minute waits in the
// tarpit; the shadow zone counted who it would have refused.
func TestDocsRecipeScraper(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone catalog_watch {", ""), "caddyfile")
	for i := range 60 {
		wantStatus(t, fmt.Sprintf("request #%d", i+1), fetch(t, tester, "GET", "/products/"+strconv.Itoa(i), "User-Agent", "Mozilla/5.0"), 200, 0, 0)
	}
	start := time.Now()
	// The tester's client gives up after 5 s; the tarpit holds up to 10.
	req, _ := http.NewRequest("GET", httpBase+"/products/61", nil)
	req.Header.Set("User-Agent", "Mozilla/5.0")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	held := time.Since(start)
	r := response{code: resp.StatusCode, header: resp.Header}
	wantStatus(t, "61st request", r, 429, 1, 60)
	if held < 5*time.Second {
		t.Fatalf("61st request answered after %v, want at least 5s in the tarpit", held)
	}
	page := adminRequest(t, "GET", "/metrics", "", "")
	if got := metricLine(page, `caddy_rate_limit_shadow_declined_requests_total{scope="",zone="catalog_watch"}`); got < 30 || got > 31 {
		t.Fatalf("shadow zone counted %v would-be denials, want the 30 past its rate", got)
	}
	start = time.Now()
	wantStatus(t, "a scraping tool", fetch(t, tester, "GET", "/products/1", "User-Agent", "python-requests/2.31"), 403, 0, 0)
	if held := time.Since(start); held > 2*time.Second {
		t.Fatalf("a 403 was held %v: the tarpit holds only 429s", held)
	}
}

// Writes are slowed to 200 a second, never refused while the line is
// under 30 s.
func TestDocsRecipeQueueConsumer(t *testing.T) {
	u := newRecordingUpstream(t, func(*http.Request, string) int { return http.StatusOK })
	tester := newTester(t, recipeSite(t, "zone db_writes {", u.addr()), "caddyfile")
	start := time.Now()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 50 {
		wg.Go(func() {
			if postFull(t, tester, "/events", `{"e":1}`).code != 200 {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if refused.Load() != 0 {
		t.Fatalf("%d writes refused, want all queued", refused.Load())
	}
	if spread := u.last().Sub(start); spread < 245*time.Millisecond {
		t.Fatalf("50 writes reached the database within %v, want at least 245ms (one per 5ms)", spread)
	}
}

// A tenant's 101st query is refused; reports run two at a time, the third
// waits for a slot.
func TestDocsRecipeDatabase(t *testing.T) {
	release := make(chan struct{})
	var reports atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/reports/") {
			reports.Add(1)
			<-release
		}
		io.WriteString(w, "rows")
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	site := strings.ReplaceAll(recipeSite(t, "zone db_pool {", addr), "reverse_proxy localhost:9001", "reverse_proxy "+addr)
	tester := newTester(t, site, "caddyfile")
	for i := range 100 {
		wantStatus(t, fmt.Sprintf("query #%d", i+1), fetch(t, tester, "GET", "/orders", "X-Tenant-Id", "t1"), 200, 0, 0)
	}
	wantStatus(t, "101st query", fetch(t, tester, "GET", "/orders", "X-Tenant-Id", "t1"), 429, 59, 60)
	wantStatus(t, "no tenant", fetch(t, tester, "GET", "/orders"), 400, 0, 0)
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for i := range 3 {
		wg.Go(func() {
			codes <- fetch(t, tester, "GET", "/reports/"+strconv.Itoa(i), "X-Tenant-Id", "t"+strconv.Itoa(i+2)).code
		})
	}
	eventually(t, "two reports running", func() bool { return reports.Load() == 2 })
	time.Sleep(300 * time.Millisecond) // give a third report the time to (wrongly) start
	if got := reports.Load(); got != 2 {
		t.Fatalf("%d reports running, want 2", got)
	}
	release <- struct{}{}
	eventually(t, "the third report starting", func() bool { return reports.Load() == 3 })
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("a report: %d, want it to wait for its slot", c)
		}
	}
}

// One recipient in five spellings has 5 an hour; a sender has 50 a day.
func TestDocsRecipeEmail(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone email_send {", ""), "caddyfile")
	send := func(user, to string) response {
		return postFull(t, tester, "/email/send", `{"to":"`+to+`","subject":"hi"}`, "Authorization", "Bearer "+user)
	}
	for i, to := range []string{"rakib@gmail.com", "Rakib@Gmail.com", "r.a.kib+x@gmail.com", "RAKIB+news@googlemail.com", "ra.kib@gmail.com"} {
		wantStatus(t, fmt.Sprintf("message #%d to %s", i+1, to), send("s1", to), 200, 0, 0)
	}
	wantStatus(t, "6th message to one recipient", send("s1", "rakib+6@gmail.com"), 429, 3599, 3600)
	for i := range 45 {
		wantStatus(t, fmt.Sprintf("s1 message #%d", i+6), send("s1", "user"+strconv.Itoa(i)+"@example.com"), 200, 0, 0)
	}
	wantStatus(t, "s1's 51st message of the day", send("s1", "other@example.com"), 429, 86390, 86400)
	wantStatus(t, "another sender", send("s2", "other@example.com"), 200, 0, 0)
}

// 100 likes an hour per user; a spike on one item is counted, not refused.
func TestDocsRecipeVotes(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone likes_item_spike {", ""), "caddyfile")
	for i := range 100 {
		wantStatus(t, fmt.Sprintf("like #%d", i+1), postFull(t, tester, "/items/"+strconv.Itoa(100+i)+"/like", ``, "Authorization", "Bearer fan"), 200, 0, 0)
	}
	wantStatus(t, "101st like", postFull(t, tester, "/items/1/like", ``, "Authorization", "Bearer fan"), 429, 3599, 3600)
	// 1,001 likes of item 7 (its paths spelled two ways) from eleven users,
	// all within one minute of the Unix epoch: the zone's windows.
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 20*time.Second {
		time.Sleep(left)
	}
	for i := range 1001 {
		path := "/items/7/like"
		if i%2 == 1 {
			path += "/"
		}
		wantStatus(t, fmt.Sprintf("like #%d of item 7", i+1), postFull(t, tester, path, ``, "Authorization", "Bearer u"+strconv.Itoa(i/91)), 200, 0, 0)
	}
	expectMetric(t, `caddy_rate_limit_shadow_declined_requests_total{scope="",zone="likes_item_spike"}`, 1)
}

// One bucket of 100 per user, each route at its cost: an export empties it,
// health checks stay free, and a search is refused in any spelling.
func TestDocsRecipeCostTable(t *testing.T) {
	tester := newTester(t, recipeSite(t, "zone api_units {", ""), "caddyfile")
	user := []string{"Authorization", "Bearer alice"}
	wantStatus(t, "an export", postFull(t, tester, "/api/report/export", `{}`, user...), 200, 0, 0)
	wantStatus(t, "a second export", postFull(t, tester, "/api/report/export", `{}`, user...), 429, 10, 10)
	for i := range 3 {
		wantStatus(t, fmt.Sprintf("health check #%d", i+1), fetch(t, tester, "GET", "/api/health", user...), 200, 0, 0)
	}
	for _, path := range []string{"/api/search", "/API/Search/", "/api/search;x"} {
		r := fetch(t, tester, "GET", path+"?q=a", user...)
		wantStatus(t, "search "+path, r, 429, 1, 1)
		if !strings.Contains(r.header.Get("RateLimit"), `"api_units";r=0`) {
			t.Fatalf("search %s: RateLimit %q", path, r.header.Get("RateLimit"))
		}
	}
	wantStatus(t, "a search as POST", postFull(t, tester, "/api/search", `{"q":"a"}`, user...), 429, 1, 1)
	for _, path := range []string{"/api//search", "/api/./search", "/api/x/../search", "//api/search"} {
		wantStatus(t, "search "+path, fetch(t, tester, "GET", path, "Authorization", "Bearer carol"), 400, 0, 0)
	}
	// Those cost carol nothing: her 100 are whole.
	wantStatus(t, "carol's export", postFull(t, tester, "/api/report/export", `{}`, "Authorization", "Bearer carol"), 200, 0, 0)
	wantStatus(t, "another user's export", postFull(t, tester, "/api/report/export/", `{}`, "Authorization", "Bearer bob"), 200, 0, 0)
}

// A client that keeps hammering a full limit is let back in as soon as the
// limit has room: denied requests are never counted, on any algorithm and
// either store (a log that recorded them, or a bucket that charged them,
// would keep a hammering client out for ever).
func TestSeedsHammeringNeverExtendsTheBlock(t *testing.T) {
	backends := map[string]string{"memory": ""}
	if redistest.Available(t) {
		backends["redis"] = "backend redis {\n\t\t\taddress " + redistest.Standalone(t, "").Addr + "\n\t\t}"
	}
	for name, backend := range backends {
		for _, algo := range []string{"sliding_window", "sliding_window_counter", "fixed_window", "token_bucket", "gcra", "leaky_bucket"} {
			t.Run(name+"/"+algo, func(t *testing.T) {
				tester := newTester(t, caddyfileServer(`
	rate_limit {
		`+backend+`
		zone seeds_hammer_`+name+`_`+algo+` {
			by ip
			rate 2/1s
			algorithm `+algo+`
		}
	}
	respond "ok"`), "caddyfile")
				allowed, denied := 0, 0
				for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					switch r := fetch(t, tester, "GET", "/"); r.code {
					case 200:
						allowed++
					case 429:
						denied++
						if r.header.Get("Retry-After") == "" {
							t.Fatal("429 without Retry-After")
						}
					default:
						t.Fatalf("status %d", r.code)
					}
				}
				// 2 at once, then 2 a second: at least 4 in 2.5 s for every
				// algorithm, and never more than 2 per second plus both ends'.
				if allowed < 4 || allowed > 9 || denied == 0 {
					t.Fatalf("hammering for 2.5 s: %d allowed, %d denied; want 4 to 9 allowed", allowed, denied)
				}
			})
		}
	}
}

// Requests refused as invalid (no usable key, an unreadable cost) charge
// no limit: a client's typos do not use up its quota.
func TestSeedsInvalidRequestsChargeNothing(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone seeds_invalid_ip {
			by ip
			rate 3/1m
			cost {http.request.header.X-Units}
		}
		zone seeds_invalid_phone {
			by json phone
			normalize phone BD
			missing deny
			rate 3/10m
		}
	}
	respond "ok"`), "caddyfile")
	for i, body := range []string{`{}`, `{"phone":"not a number"}`, `{"phone":"017"}`, `not json`, `{"phone":["01712345678"]}`} {
		wantStatus(t, fmt.Sprintf("invalid request #%d", i+1), postFull(t, tester, "/otp", body), 400, 0, 0)
	}
	wantStatus(t, "unreadable cost", postFull(t, tester, "/otp", `{"phone":"01712345678"}`, "X-Units", "lots"), 400, 0, 0)
	for i, phone := range []string{"01712345678", "01812345678", "01912345678"} {
		wantStatus(t, fmt.Sprintf("valid request #%d", i+1), postFull(t, tester, "/otp", `{"phone":"`+phone+`"}`), 200, 0, 0)
	}
	wantStatus(t, "4th valid request", postFull(t, tester, "/otp", `{"phone":"01612345678"}`), 429, 59, 60)
}

// A load test's checks: 200 requests a second for 3 s against 60 a minute
// are either allowed or limited, never a 5xx, every 429 has Retry-After;
// the exact window admits exactly 60, a policy without burst 1 plus one
// a second.
func TestSeedsLoadAllowedOrLimited(t *testing.T) {
	tester := newTester(t, caddyfileServer(`
	rate_limit {
		zone seeds_load_window {
			match {
				path /window
			}
			by header Authorization
			rate 60/1m
		}
		zone seeds_load_smooth {
			match {
				path /smooth
			}
			by header Authorization
			rate 60/1m
			burst 1
			algorithm gcra
		}
	}
	respond "ok"`), "caddyfile")
	for _, path := range []string{"/window", "/smooth"} {
		var ok, limited, other atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		for range 600 {
			<-tick.C
			wg.Go(func() {
				r := fetch(t, tester, "GET", path, "Authorization", "Bearer k6")
				switch {
				case r.code == 200:
					ok.Add(1)
				case r.code == 429 && r.header.Get("Retry-After") != "":
					limited.Add(1)
				default:
					other.Add(1)
				}
			})
		}
		tick.Stop()
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		if other.Load() != 0 || ok.Load()+limited.Load() != 600 {
			t.Fatalf("%s: %d allowed, %d limited with Retry-After, %d other", path, ok.Load(), limited.Load(), other.Load())
		}
		switch n := ok.Load(); {
		case path == "/window" && n != 60:
			t.Fatalf("/window: %d allowed, want exactly 60", n)
		case path == "/smooth" && (n < 2 || float64(n) > 2+elapsed):
			t.Fatalf("/smooth: %d allowed in %.1fs, want 1 plus one a second", n, elapsed)
		}
	}
}

// The worked examples' numbers as a client sees them through Caddy: how
// many of a burst pass, and the Retry-After and RateLimit fields of the
// first denial.
func TestSeedsWorkedExamplesOverHTTP(t *testing.T) {
	tests := []struct {
		name, opts string
		burst      int    // requests sent at once
		pass       int    // how many pass (more only by refill)
		perSecond  int    // refill per second, to bound the extra passes
		retryAfter int    // of the first denial
		policy     string // RateLimit-Policy of the first denial
	}{
		// Capacity 10 refilled at 5 a second: 10 of 12 pass, the 11th
		// waits 0.2 s (sent as 1).
		{"tb_10_at_5", "rate 5/1s\n\t\t\tburst 10\n\t\t\talgorithm token_bucket", 12, 10, 5, 1, `"seeds_we_tb_10_at_5";q=10;w=2`},
		// Capacity 20 at 2 a second: 20 of 25, the next waits 0.5 s.
		{"tb_20_at_2", "rate 2/1s\n\t\t\tburst 20\n\t\t\talgorithm token_bucket", 25, 20, 2, 1, `"seeds_we_tb_20_at_2";q=20;w=10`},
		// Capacity 50 at 10 a second: 50 of 60.
		{"tb_50_at_10", "rate 10/1s\n\t\t\tburst 50\n\t\t\talgorithm token_bucket", 60, 50, 10, 1, `"seeds_we_tb_50_at_10";q=50;w=5`},
		// GCRA 10 a minute, burst 3: T = 6 s, τ = 12 s; the 4th waits
		// TAT − τ − now = 18 − 12 − 0 = 6 s.
		{"gcra_10m_b3", "rate 10/1m\n\t\t\tburst 3\n\t\t\talgorithm gcra", 4, 3, 0, 6, `"seeds_we_gcra_10m_b3";q=3;w=18`},
		// GCRA 20 a minute, burst 4: T = 3 s, τ = 9 s; the 5th and 6th
		// wait 3 s.
		{"gcra_20m_b4", "rate 20/1m\n\t\t\tburst 4\n\t\t\talgorithm gcra", 6, 4, 0, 3, `"seeds_we_gcra_20m_b4";q=4;w=12`},
		// GCRA 30 a minute, burst 5: T = 2 s, τ = 8 s.
		{"gcra_30m_b5", "rate 30/1m\n\t\t\tburst 5\n\t\t\talgorithm gcra", 6, 5, 0, 2, `"seeds_we_gcra_30m_b5";q=5;w=10`},
		// The exact log, 100 a minute: the boundary attack's second 100
		// are all refused, for a minute.
		{"log_100m", "rate 100/1m", 200, 100, 0, 60, `"seeds_we_log_100m";q=100;w=60`},
	}
	zones := ""
	for _, tt := range tests {
		zones += "\n\t\tzone seeds_we_" + tt.name + " {\n\t\t\tmatch {\n\t\t\t\tpath /" + tt.name + "\n\t\t\t}\n\t\t\tkey static\n\t\t\t" + tt.opts + "\n\t\t}"
	}
	tester := newTester(t, caddyfileServer("\trate_limit {\n\t\theaders draft"+zones+"\n\t}\n\trespond \"ok\""), "caddyfile")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			passed, denials := 0, 0
			var first response
			for range tt.burst {
				r := fetch(t, tester, "GET", "/"+tt.name)
				switch r.code {
				case 200:
					passed++
				case 429:
					if denials == 0 {
						first = r
					}
					denials++
				default:
					t.Fatalf("status %d", r.code)
				}
			}
			extra := float64(tt.perSecond)*time.Since(start).Seconds() + 1
			if passed < tt.pass || float64(passed) > float64(tt.pass)+extra || denials == 0 {
				t.Fatalf("%d of %d passed, want %d (plus the refill)", passed, tt.burst, tt.pass)
			}
			// A whole second of wait may have passed by the first denial of
			// a minute-long one.
			if got := first.header.Get("Retry-After"); got != strconv.Itoa(tt.retryAfter) && (tt.retryAfter < 6 || got != strconv.Itoa(tt.retryAfter-1)) {
				t.Fatalf("first denial: Retry-After %q, want %d", got, tt.retryAfter)
			}
			if got := first.header.Get("RateLimit-Policy"); got != tt.policy {
				t.Fatalf("first denial: RateLimit-Policy %q, want %q", got, tt.policy)
			}
		})
	}
}

// The Cloudflare options of docs/keys.md: the header counts only from a
// trusted peer, and then each address it names is its own client.
func TestDocsCloudflareClientIP(t *testing.T) {
	var globals string
	for _, b := range docBlocks(t) {
		if strings.HasPrefix(b.where, "../docs/keys.md:") && strings.Contains(b.text, "CF-Connecting-IP") {
			globals = strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(b.text), "{")), "}")
		}
	}
	if globals == "" {
		t.Fatal("no Cloudflare block in docs/keys.md")
	}
	site := `	rate_limit {
		zone seeds_cf {
			by ip
			rate 2/1h
		}
	}
	respond "ok"`
	// The test's peer, 127.0.0.1, is not Cloudflare: its header is ignored.
	tester := newTester(t, caddyfileServerWith(globals, site), "caddyfile")
	for i := range 200 {
		want := 200
		if i >= 2 {
			want = 429
		}
		if r := fetch(t, tester, "GET", "/", "CF-Connecting-IP", fmt.Sprintf("198.51.100.%d", i%250)); r.code != want {
			t.Fatalf("untrusted peer, request #%d: %d, want %d", i+1, r.code, want)
		}
	}
	// The peer in the trusted ranges: each address is a client.
	tester = newTester(t, caddyfileServerWith(strings.Replace(globals, "173.245.48.0/20", "127.0.0.1/32", 1), site), "caddyfile")
	for _, ip := range []string{"198.51.100.1", "198.51.100.2", "2001:db8:1:2::1"} {
		expectN(t, tester, 2, 200, "GET", "/", "CF-Connecting-IP", ip)
	}
	expect429(t, tester, 3599, 3600, "GET", "/", "CF-Connecting-IP", "198.51.100.1", "X-Forwarded-For", "203.0.113.9")
	expect429(t, tester, 3599, 3600, "GET", "/", "CF-Connecting-IP", "2001:db8:1:2::ffff")
}

// A spend budget with a constant key is a gauge, so an alert can fire
// before it runs out: committed units and open reservations are deducted,
// released ones are not; a budget per client makes no series.
func TestSeedsBudgetRemainingGauge(t *testing.T) {
	backends := map[string]string{"mem": ""}
	if redistest.Available(t) {
		backends["redis"] = "backend redis {\n\t\t\taddress " + redistest.Standalone(t, "").Addr + "\n\t\t}"
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) { testBudgetRemainingGauge(t, "seeds_gauge_"+name, backend) })
	}
}

func testBudgetRemainingGauge(t *testing.T, zone, backend string) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("answer") {
		case "fail":
			w.WriteHeader(http.StatusBadGateway)
		case "hold":
			<-release
		}
	}))
	t.Cleanup(srv.Close)
	newTester(t, caddyfileServer(`
	rate_limit {
		`+backend+`
		zone `+zone+` {
			key sms
			rate 5/1d
			algorithm fixed_window
			charge_when status 2xx
			scope hour {
				rate 4/1h
				charge_when status 2xx
			}
		}
		zone `+zone+`_per_user {
			by header X-User
			rate 5/1d
			charge_when status 2xx
		}
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")), "caddyfile")
	gauge := func(name, scope string) float64 {
		return metricLine(adminRequest(t, "GET", "/metrics", "", ""), `caddy_rate_limit_budget_`+name+`{scope="`+scope+`",zone="`+zone+`"}`)
	}
	if r, l := gauge("remaining", ""), gauge("limit", ""); r != 5 || l != 5 {
		t.Fatalf("before any request: remaining %v of %v, want 5 of 5", r, l)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(answer string) int {
		resp, err := client.Get(httpBase + "/send?answer=" + answer)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, answer := range []string{"ok", "fail", "ok"} {
		send(answer)
	}
	if r, h := gauge("remaining", ""), gauge("remaining", "hour"); r != 3 || h != 2 {
		t.Fatalf("after 2 sent and 1 failed: remaining %v (day) and %v (hour), want 3 and 2", r, h)
	}
	if l := gauge("limit", "hour"); l != 4 {
		t.Fatalf("hour budget's limit %v, want 4", l)
	}
	done := make(chan int)
	go func() { done <- send("hold") }()
	eventually(t, "the held request's reservation", func() bool { return gauge("remaining", "") == 2 })
	close(release)
	<-done
	if r := gauge("remaining", ""); r != 2 {
		t.Fatalf("after the held request succeeded: remaining %v, want 2", r)
	}
	if page := adminRequest(t, "GET", "/metrics", "", ""); strings.Contains(page, `caddy_rate_limit_budget_remaining{scope="",zone="`+zone+`_per_user"}`) {
		t.Fatal("a budget keyed per client has a series")
	}
}

// The five layers of the OTP example of docs/keys.md, each at its number:
// 10 codes per address, 40 per /24, 500 a minute for the service.
func TestDocsOTPExampleLayers(t *testing.T) {
	t.Setenv("SLUICE_KEY_SECRET", recipeSecret)
	site := docSite(t, "../docs/keys.md", "zone otp_send {\n\t\t\tmatch")
	// The test's peer stands for the load balancer the example trusts.
	tester := newTester(t, strings.Replace(site, "trusted_proxies static 10.0.0.0/8", "trusted_proxies static 127.0.0.1/32", 1), "caddyfile")
	next := 0
	send := func(ip string) (int, string) {
		next++
		return post(t, tester, "/otp/send", "application/json", fmt.Sprintf(`{"phone":"0171%07d"}`, next), "X-Forwarded-For", ip)
	}
	// The service's bucket refills from its first code on: a loaded
	// machine takes seconds for the 40 before the flood.
	start := time.Now()
	for i := range 10 {
		if code, body := send("198.51.100.1"); code != 200 {
			t.Fatalf("address's code #%d: %d %q", i+1, code, body)
		}
	}
	if code, body := send("198.51.100.1"); code != 429 || !strings.Contains(body, `"retry_after":600`) {
		t.Fatalf("address's 11th code: %d %q, want 429 with retry_after 600", code, body)
	}
	for _, ip := range []string{"198.51.100.2", "198.51.100.3", "198.51.100.4"} {
		for i := range 10 {
			if code, body := send(ip); code != 200 {
				t.Fatalf("%s code #%d: %d %q", ip, i+1, code, body)
			}
		}
	}
	if code, body := send("198.51.100.5"); code != 429 || !strings.Contains(body, `"retry_after":6`) {
		t.Fatalf("the /24's 41st code: %d %q, want 429 with retry_after about 600", code, body)
	}
	// The service's ceiling: 500 a minute in bursts of 500, from addresses
	// of many networks (40 of it were sent above).
	allowed := 40
	for n := 0; ; n++ {
		code, body := send(fmt.Sprintf("203.0.%d.%d", n/40, 1+n%40/10))
		if code == 429 {
			if !strings.Contains(body, `"retry_after":1}`) {
				t.Fatalf("over the ceiling: %q, want retry_after 1", body)
			}
			break
		}
		if code != 200 || n > 1000 {
			t.Fatalf("code #%d: %d %q", allowed+1, code, body)
		}
		allowed++
	}
	if elapsed := time.Since(start).Seconds(); allowed < 500 || float64(allowed) > 500+500.0/60*elapsed+1 {
		t.Fatalf("the service sent %d codes in %.1fs before its ceiling, want 500 plus the refill", allowed, elapsed)
	}
}
