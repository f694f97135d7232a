package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// noRateLimitFields fails if r tells the client anything of its quota.
func noRateLimitFields(t *testing.T, what string, r response) {
	t.Helper()
	for name := range r.header {
		if strings.Contains(strings.ToLower(name), "ratelimit") {
			t.Fatalf("%s: %s: %q sent on a zone with headers none", what, name, r.header.Get(name))
		}
	}
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
	tester := newTester(t, recipeSite(t, "zone payment_card {", u.addr), "caddyfile")
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
	site := strings.Replace(recipeSite(t, "zone places_qps {", ""), "reverse_proxy https://maps.googleapis.com", "reverse_proxy "+u.addr, 1)
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
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") == "Bearer a" {
			streaming.Add(1)
			<-release
		}
		w.Header().Set("X-Tokens-Used", "1800")
		io.WriteString(w, "answer")
	})
	tester := newTester(t, recipeSite(t, "scope daily_spend {", addr), "caddyfile")
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
	tester := newTester(t, recipeSite(t, "zone db_writes {", u.addr), "caddyfile")
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
	_, addr := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/reports/") {
			reports.Add(1)
			<-release
		}
		io.WriteString(w, "rows")
	})
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
