package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// tokensLeft is what the admin API says the key "Bearer <key>" has left
// in scope tokens of zone, or -1.
func tokensLeft(zone, key string) int64 {
	resp, err := http.Get("http://" + adminAddr + "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape("Bearer "+key) + "?scope=tokens")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var v struct{ Limits []adminLimit }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || len(v.Limits) != 1 {
		return -1
	}
	return v.Limits[0].Remaining
}

// tokensWithin fails unless got is want plus at most what the tokens
// scope (200,000 a minute) refilled since since: the bucket refills in
// real time while the test runs.
func tokensWithin(t *testing.T, what string, got, want int64, since time.Time) {
	t.Helper()
	refill := int64(time.Since(since)*200000/time.Minute) + 1
	if got < want || got > want+refill {
		t.Fatalf("%s: %d tokens left, want %d (+ up to %d refilled in %v)", what, got, want, refill, time.Since(since))
	}
}

// chat posts a chat completion of a 1000-byte body asking for maxTokens,
// whose answer reports used tokens (none when used is "").
func chat(t *testing.T, tester *caddytest.Tester, key string, maxTokens int, used string, header ...string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"max_tokens": %d, "messages": [{"role": "user", "content": "`, maxTokens)
	body += strings.Repeat("x", 1000-len(body)-4) + `"}]}`
	if len(body) != 1000 {
		t.Fatalf("body of %d bytes", len(body))
	}
	req, _ := http.NewRequest("POST", httpBase+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	if used != "" {
		req.Header.Set("X-Test-Used", used)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// llmSite is the LLM proxy of docs/outcomes.md, proxying to u, on the
// given backend, with its zone renamed.
func llmSite(t *testing.T, backend, zone string, u *tokenUpstream) *caddytest.Tester {
	site := docOutcomeSite(t, "settle {http.response.header.X-Tokens-Used}", u.addr)
	site = strings.Replace(site, "zone llm {", "zone "+zone+" {", 1)
	site = strings.Replace(site, "rate_limit {", "rate_limit {\n\t\t"+backend, 1)
	return newTester(t, site, "caddyfile")
}

// settleBackends runs f on the memory store and on a real Redis.
func settleBackends(t *testing.T, f func(t *testing.T, backend, zone string)) {
	t.Run("memory", func(t *testing.T) { f(t, "", fmt.Sprintf("settle_mem_%d", time.Now().UnixNano())) })
	t.Run("redis", func(t *testing.T) {
		redis := redistest.Standalone(t, "")
		prefix := fmt.Sprintf("settle%d:", time.Now().UnixNano())
		f(t, fmt.Sprintf("backend redis {\n\t\t\taddress %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout 2s\n\t\t}", redis.Addr, prefix), fmt.Sprintf("settle_redis_%d", time.Now().UnixNano()))
	})
}

// The LLM proxy of docs/outcomes.md, as written: 1000 in + max_tokens
// 4000 reserve 5000; 1800 used gives 3200 back. 250,000 used puts the key
// in debt, and its next call waits it out. The zone refuses the 501st
// request of a minute.
func TestDocsOutcomeLLM(t *testing.T) {
	settleBackends(t, func(t *testing.T, backend, zone string) {
		u := newTokenUpstream(t, func() int64 { return tokensLeft(zone, "k1") })
		tester := llmSite(t, backend, zone, u)

		start := time.Now()
		if code, _ := chat(t, tester, "k1", 4000, "1800"); code != http.StatusOK {
			t.Fatalf("chat: %d", code)
		}
		during := u.during.Load()
		tokensWithin(t, "while the call ran (5000 reserved)", during, 195000, start)
		after := tokensLeft(zone, "k1")
		tokensWithin(t, "after the call (1800 used)", after, 198200, start)
		tokensWithin(t, "given back", after-during, 3200, start)

		// 250,000 used: 1800 + 250,000 in use, 51,800 owed past the
		// bucket; the next 5000 wait for 56,800 tokens at 200,000 per
		// minute: 17.04 s, less what refilled meanwhile.
		if code, _ := chat(t, tester, "k1", 4000, "250000"); code != http.StatusOK {
			t.Fatalf("chat: %d", code)
		}
		if got := tokensLeft(zone, "k1"); got != 0 {
			t.Fatalf("%d tokens left after 250,000 used, want 0", got)
		}
		before := u.hits.Load()
		code, ra := chat(t, tester, "k1", 4000, "1")
		if code != http.StatusTooManyRequests || (ra != "17" && ra != "18") || u.hits.Load() != before {
			t.Fatalf("the call after the debt: %d, Retry-After %q, reached the upstream %v; want 429 after 17 s, not reached", code, ra, u.hits.Load() != before)
		}
		// Another key is not in debt.
		if code, _ := chat(t, tester, "k2", 4000, "10"); code != http.StatusOK {
			t.Fatalf("another key: %d", code)
		}

		// 500 requests a minute: about the 501st is refused by the zone,
		// however few tokens they use (the bucket refills one request per
		// 120 ms while they are sent).
		start = time.Now()
		admitted := 0
		for {
			code, ra := chat(t, tester, "k3", 10, "1")
			if code == http.StatusTooManyRequests {
				if ra != "1" {
					t.Fatalf("refused with Retry-After %q, want 1", ra)
				}
				break
			}
			if code != http.StatusOK || admitted > 1000 {
				t.Fatalf("request %d of key k3: %d", admitted+1, code)
			}
			admitted++
		}
		if most := 500 + int(time.Since(start)/(120*time.Millisecond)) + 1; admitted < 500 || admitted > most {
			t.Fatalf("%d requests admitted in %v, want 500 to %d", admitted, time.Since(start), most)
		}
	})
}

// A streamed answer reports its tokens in a trailer, which reverse_proxy
// passes on after the body: it is settled once the body is over.
func TestSettleTrailerThroughProxy(t *testing.T) {
	settleBackends(t, func(t *testing.T, backend, zone string) {
		u := newTokenUpstream(t, nil)
		tester := llmSite(t, backend, zone, u)
		start := time.Now()
		if code, _ := chat(t, tester, "k1", 4000, "1800", "X-Test-Trailer", "1"); code != http.StatusOK {
			t.Fatalf("chat: %d", code)
		}
		tokensWithin(t, "after a trailer of 1800", tokensLeft(zone, "k1"), 198200, start)
	})
}

// A response without a usable count keeps the estimate: missing, garbage,
// negative, a float, huge, or given twice.
func TestSettleGarbageKeepsEstimate(t *testing.T) {
	settleBackends(t, func(t *testing.T, backend, zone string) {
		u := newTokenUpstream(t, nil)
		tester := llmSite(t, backend, zone, u)
		left := int64(200000)
		start := time.Now()
		for _, used := range []string{"", "lots", "-1800", "1.8e3", "1800 tokens", "99999999999999999999", "1800, 1"} {
			if code, _ := chat(t, tester, "k1", 4000, used); code != http.StatusOK {
				t.Fatalf("chat reporting %q: %d", used, code)
			}
			left -= 5000
			tokensWithin(t, fmt.Sprintf("after a report of %q (the estimate kept)", used), tokensLeft(zone, "k1"), left, start)
		}
	})
}

// settle is refused where it cannot be exact, naming the option.
func TestSettleConfigErrors(t *testing.T) {
	for _, tc := range []struct{ opts, want string }{
		{"rate 10/1m\n\t\t\tsettle 1800", "settle must be one placeholder"},
		{"rate 10/1m\n\t\t\tsettle {http.request.header.X-Tokens}", "settle reads the response"},
		{"rate 10/1m\n\t\t\talgorithm leaky_bucket\n\t\t\tmax_delay 1s\n\t\t\tsettle {http.response.header.X-Tokens-Used}", "settle cannot be used with max_delay"},
		{"rate 10/1m\n\t\t\tsettle {http.response.header.X-Tokens-Used} {http.vars.x}", "settle takes one value"},
	} {
		assertLoadError(t, caddyfileServer(`
	rate_limit {
		zone settle_bad {
			by ip
			`+tc.opts+`
		}
	}
	respond "ok"`), "caddyfile", tc.want)
	}
}

// With a lease, the estimate is spent from the lease and the real cost is
// settled in Redis itself: 1000 leased, 500 spent, 200 used, 300 back.
func TestSettleWithLease(t *testing.T) {
	redis := redistest.Standalone(t, "")
	zone := fmt.Sprintf("settle_lease_%d", time.Now().UnixNano())
	u := newTokenUpstream(t, nil)
	tester := newTester(t, caddyfileServer(fmt.Sprintf(`
	rate_limit {
		backend redis {
			address %s
			key_prefix settle%d:
			timeout 2s
		}
		zone %s {
			key {http.request.header.X-Tenant}
			rate 100000/1m
			algorithm token_bucket
			lease 1000
			cost {http.request.header.X-Cost}
			settle {http.response.header.X-Tokens-Used}
		}
	}
	reverse_proxy %s`, redis.Addr, time.Now().UnixNano(), zone, u.addr)), "caddyfile")
	start := time.Now()
	code, _, _ := do(t, tester, "POST", "/v1/chat/completions", "X-Tenant", "t1", "X-Cost", "500", "X-Test-Used", "200")
	if code != http.StatusOK {
		t.Fatalf("chat: %d", code)
	}
	ls := keyOp(t, "GET", "/rate_limit/zones/"+zone+"/keys/t1")
	refill := int64(time.Since(start)*100000/time.Minute) + 1
	if got := ls[0].Remaining; got < 99300 || got > 99300+refill {
		t.Fatalf("Redis has %d left, want 99300 (1000 leased, 300 given back; + up to %d refilled)", got, refill)
	}
}

// llmPrompt is a chat completion's JSON body with a prompt of n bytes and,
// when maxTokens is not 0, max_tokens.
func llmPrompt(n, maxTokens int) string {
	body := `{"messages": [{"role": "user", "content": "` + strings.Repeat("x", n) + `"}]`
	if maxTokens != 0 {
		body += fmt.Sprintf(`, "max_tokens": %d`, maxTokens)
	}
	return body + "}"
}

// A way to send a call of the LLM proxy: its status, or 0 when it failed.
type llmSender struct {
	name string
	send func(t *testing.T, tester *caddytest.Tester, key, body string) int
}

// llmShapes are the ways a call can carry its body: with Content-Length,
// chunked (HTTP/1.1 Transfer-Encoding: chunked) and on HTTP/2 (h2c)
// without content-length.
var llmShapes = []llmSender{
	{"content_length", func(t *testing.T, tester *caddytest.Tester, key, body string) int {
		req, _ := http.NewRequest("POST", httpBase+"/v1/chat/completions", strings.NewReader(body))
		return llmDo(t, tester.Client, req, key, 1)
	}},
	{"chunked", func(t *testing.T, _ *caddytest.Tester, key, body string) int {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(httpPort))
		if err != nil {
			t.Error(err)
			return 0
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", key, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Error(err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}},
	{"h2c", func(t *testing.T, _ *caddytest.Tester, key, body string) int {
		// A reader of unknown length: the body goes as DATA frames
		// without content-length.
		req, _ := http.NewRequest("POST", "http://127.0.0.1:"+strconv.Itoa(httpPort)+"/v1/chat/completions", struct{ io.Reader }{strings.NewReader(body)})
		return llmDo(t, h2cClient, req, key, 2)
	}},
}

var h2cClient = func() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}()

func llmDo(t *testing.T, client *http.Client, req *http.Request, key string, proto int) int {
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.ProtoMajor != proto {
		t.Errorf("answered over HTTP/%d, want HTTP/%d", resp.ProtoMajor, proto)
	}
	return resp.StatusCode
}

// llmSiteSmall is the LLM proxy of docs/outcomes.md, proxying to addr, its
// tokens scope set to 20,000 (an hour's: what refills while a test runs
// is far below any call's estimate), with HTTP/2 over cleartext.
func llmSiteSmall(t *testing.T, backend, zone, addr string) *caddytest.Tester {
	site := docOutcomeSite(t, "settle {http.response.header.X-Tokens-Used}", addr)
	if !strings.Contains(site, "rate 200000/1m") || !strings.Contains(site, "http_port 9080\n}") {
		t.Fatal("the docs' LLM proxy no longer has a tokens scope of rate 200000/1m")
	}
	site = strings.Replace(site, "rate 200000/1m", "rate 20000/1h", 1)
	site = strings.Replace(site, "http_port 9080\n}", "http_port 9080\n\tservers {\n\t\tprotocols h1 h2c\n\t}\n}", 1)
	site = strings.Replace(site, "zone llm {", "zone "+zone+" {", 1)
	site = strings.Replace(site, "rate_limit {", "rate_limit {\n\t\t"+backend, 1)
	return newTester(t, site, "caddyfile")
}

// concurrentCalls sends n calls at once through shape and returns how many
// reached the upstream and how many were refused with 429: the upstream
// holds the calls it gets until every call is either in it or refused.
func concurrentCalls(t *testing.T, tester *caddytest.Tester, u *heldTokenUpstream, shape llmSender, n int, key, body string) (admitted, refused int) {
	t.Helper()
	var wg sync.WaitGroup
	var ok, denied atomic.Int64
	for range n {
		wg.Go(func() {
			switch code := shape.send(t, tester, key, body); code {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				denied.Add(1)
			default:
				t.Errorf("%s call: %d", shape.name, code)
			}
		})
	}
	start := u.arrived.Load()
	for deadline := time.Now().Add(10 * time.Second); u.arrived.Load()-start+denied.Load() < int64(n) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	close(u.release)
	wg.Wait()
	return int(ok.Load()), int(denied.Load())
}

// Concurrent calls can never spend more than the limit between them when
// their estimates hold what they use, whatever the body's shape: 20 calls
// at once, without max_tokens, of a short prompt that uses 4000 tokens
// each, against 20,000 tokens, chunked and on HTTP/2 without
// content-length. Each reserves the docs' floor of 4096: 4 are let
// through, 16,000 tokens used, and the key is not in debt.
func TestDocsOutcomeLLMChunkedCallsWithinLimit(t *testing.T) {
	settleBackends(t, func(t *testing.T, backend, zone string) {
		for _, shape := range llmShapes[1:] {
			t.Run(shape.name, func(t *testing.T) {
				u := newHeldTokenUpstream(t, "4000")
				tester := llmSiteSmall(t, backend, zone+"_"+shape.name, u.addr)
				admitted, refused := concurrentCalls(t, tester, u, shape, 20, "k1", llmPrompt(100, 0))
				used := admitted * 4000
				left := tokensLeft(zone+"_"+shape.name, "k1")
				t.Logf("%d of 20 calls let through (%d refused), %d tokens used of 20,000, %d left", admitted, refused, used, left)
				if used > 20000 || left <= 0 {
					t.Fatalf("%d calls at once used %d tokens of a limit of 20,000 (%d left): the estimates held less than they used", admitted, used, left)
				}
				if admitted != 4 {
					t.Fatalf("%d calls let through, want 4 (4096 each, the floor, of 20,000)", admitted)
				}
			})
		}
	})
}

// A chunked prompt, or one on HTTP/2 without content-length, is counted by
// its bytes as one with Content-Length is: 10 calls at once of a
// 9,000-byte prompt with max_tokens 1000 (about 10,060 tokens reserved
// each) against 20,000 tokens let 1 through in every shape.
func TestDocsOutcomeLLMChunkedPromptCounted(t *testing.T) {
	settleBackends(t, func(t *testing.T, backend, zone string) {
		for _, shape := range llmShapes {
			t.Run(shape.name, func(t *testing.T) {
				u := newHeldTokenUpstream(t, "3000")
				tester := llmSiteSmall(t, backend, zone+"_"+shape.name, u.addr)
				body := llmPrompt(9000, 1000)
				admitted, refused := concurrentCalls(t, tester, u, shape, 10, "k1", body)
				t.Logf("%s: %d of 10 calls let through, %d refused", shape.name, admitted, refused)
				if admitted != 1 || refused != 9 {
					t.Fatalf("%s: %d of 10 calls of a 9,000-byte prompt let through (%d refused) on 20,000 tokens, want 1", shape.name, admitted, refused)
				}
				if fmt.Sprint(u.bodies) != fmt.Sprint([]int{len(body)}) {
					t.Fatalf("%s: the upstream got bodies of %v bytes, want one of %d", shape.name, u.bodies, len(body))
				}
				if shape.name == "content_length" {
					return
				}
				// Over body_limit (1 MiB) without Content-Length: no size.
				if code := shape.send(t, tester, "k2", llmPrompt(1<<20, 1000)); code != http.StatusBadRequest {
					t.Fatalf("%s: a body over body_limit: %d, want 400", shape.name, code)
				}
				if len(u.bodies) != 1 {
					t.Fatalf("%s: a body over body_limit reached the upstream", shape.name)
				}
			})
		}
	})
}

// A reservation the refill paid off while its request was held cannot be
// cashed as a second burst: a bucket of 10 refilled while A (10 reserved,
// 0 used) was held, B spent it (10 used), and A's settle must not fill it
// again: C would pass too (20 units in an instant from a bucket of 10;
// with the built binary, 4 held reservations would cash 550 units in 1.6 s
// from a bucket of 100 at 50/s, which allows 180). Memory and Redis alike.
func TestSettleRefundAfterRefill(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			<-release
		}
		w.Header().Set("X-Used", r.URL.Query().Get("used"))
		w.Write([]byte("done"))
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	addr := redistest.Standalone(t, "").Addr
	for _, c := range []struct{ zone, backend string }{
		{"a7refill_mem", ""},
		{"a7refill_redis", "backend redis {\n\t\t\taddress " + addr + "\n\t\t\ttimeout 2s\n\t\t}"},
	} {
		t.Run(c.zone, func(t *testing.T) {
			release = make(chan struct{})
			tester := newTester(t, caddyfileServer(`
	rate_limit {
		`+c.backend+`
		zone `+c.zone+` {
			key {http.request.header.X-Key}
			rate 10/1s
			algorithm token_bucket
			cost {http.request.header.X-Cost}
			settle {http.response.header.X-Used}
		}
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")), "caddyfile")
			held := make(chan int, 1)
			go func() {
				code, _, _ := do(t, tester, "GET", "/?hold=1&used=0", "X-Key", "k", "X-Cost", "10")
				held <- code
			}()
			time.Sleep(1200 * time.Millisecond) // the bucket refills while A is held
			expectN(t, tester, 1, http.StatusOK, "GET", "/?used=10", "X-Key", "k", "X-Cost", "10")
			close(release)
			if code := <-held; code != http.StatusOK {
				t.Fatalf("the held request got %d", code)
			}
			if code, _, _ := do(t, tester, "GET", "/", "X-Key", "k", "X-Cost", "10"); code != http.StatusTooManyRequests {
				t.Fatalf("a third burst right after the settle got %d, want 429", code)
			}
		})
	}
}
