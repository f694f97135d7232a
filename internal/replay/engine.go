package replay

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
)

// Options are the inputs of a replay.
type Options struct {
	// Config is the Caddy JSON config, as it runs.
	Config []byte
	// Logs are the access log files, in any order; "-" is standard input.
	Logs []string
	// Reorder is how long a request may have taken and still be replayed
	// in its place (DefaultReorder when 0).
	Reorder time.Duration
	// Server names the server that replays lines whose logger names none.
	Server string
	// Prepare is called with every rate_limit handler after it is
	// provisioned and before any request: it gives the handler the
	// replay's clock (Unix ns) and timers that fire at once.
	Prepare func(h caddyhttp.MiddlewareHandler, now func() int64)
	// Decisions, when set, receives one JSON line per request replayed.
	Decisions io.Writer
	// Source is the config file as written and Adapter its adapter ("" for
	// JSON): recommend proposes its zone blocks in that form.
	Source, Adapter string
}

// Result is what a replay found.
type Result struct {
	Files                 []string
	Lines, Entries, Other int64
	Malformed             int64
	MalformedExamples     []Malformed
	Late                  int64
	LongestLate           int64
	// Passed counts requests that went through every rate limit; Refused
	// the others by status.
	Passed  int64
	Refused map[int]int64
	// RefusedBy counts refusals by the zone that refused.
	RefusedBy map[string]int64
	// Unrouted counts lines whose logger named no server (replayed
	// through the fallback server).
	Unrouted       int64
	UnroutedServer string
	// First and Last are the first and last arrival replayed (Unix ns).
	First, Last int64
	Limits      []*LimitStats // by zone, then scope
	Elapsed     time.Duration

	byKey map[[2]string]*LimitStats
}

// Limit is the stats of zone/scope, or nil.
func (r *Result) Limit(zone, scope string) *LimitStats { return r.byKey[[2]string{zone, scope}] }

var registerOnce sync.Once

// Register registers the replay's store and response handler as Caddy
// modules. Only a process that replays calls it: a serving Caddy never
// lists them.
func Register() {
	registerOnce.Do(func() {
		caddy.RegisterModule(new(replayStore))
		caddy.RegisterModule(new(responder))
	})
}

// session is one replay's state, reached from every request's context.
type session struct {
	clock    atomic.Int64
	response bool
	limits   map[[2]string]*LimitStats
	infos    map[[2]string]*LimitInfo
	peaks    bool
}

func (s *session) limit(zone, scope string) *LimitStats {
	k := [2]string{zone, scope}
	if ls := s.limits[k]; ls != nil {
		return ls
	}
	var window int64
	var rate float64
	if li := s.infos[k]; li != nil && s.peaks && li.Window > 0 && li.MaxEvents > 0 {
		window, rate = li.Window, float64(li.MaxEvents)/float64(li.Window)
	}
	ls := newLimitStats(zone, scope, window, rate)
	s.limits[k] = ls
	return ls
}

// reqState is the request being replayed, in its context.
type reqState struct {
	sess     *session
	entry    *Entry
	now      int64
	reached  bool // the request got past every handler to the log's answer
	unknown  bool // and the log has no answer for it
	observed []*LimitStats
}

type ctxKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(ctxKey{}).(*reqState)
	return st
}

// replayStore is the memory store on the replay's clock, telling the
// session each decision. Embedding the store keeps every optional
// interface of it (reservations, settling, lockouts, admin).
type replayStore struct {
	*memory.Store
	t     atomic.Int64
	names map[backend.Limit][2]string
	stats map[backend.Limit]*LimitStats
}

// CaddyModule returns the Caddy module information.
func (*replayStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID: backend.Namespace + "." + storeModule,
		New: func() caddy.Module {
			s := &replayStore{names: map[backend.Limit][2]string{}, stats: map[backend.Limit]*LimitStats{}}
			s.Store = memory.New(memory.Options{Now: s.t.Load})
			return s
		},
	}
}

// Configure keeps the replay's clock whatever the handler's is.
func (s *replayStore) Configure(st backend.Setup) {
	st.Now = s.t.Load
	s.Store.Configure(st)
}

// Register registers cfg with the memory store and remembers its name.
func (s *replayStore) Register(cfg backend.LimitConfig) (backend.Limit, error) {
	l, err := s.Store.Register(cfg)
	if err == nil {
		s.names[l] = [2]string{cfg.Name, cfg.Scope}
	}
	return l, err
}

// Decide decides at the request's time, and counts each limit's answer.
func (s *replayStore) Decide(ctx context.Context, reqs []backend.Request, out []algorithms.Result) (bool, error) {
	st := stateOf(ctx)
	if st != nil {
		s.t.Store(st.now)
	}
	ok, err := s.Store.Decide(ctx, reqs, out)
	if err != nil || st == nil {
		return ok, err
	}
	for i := range reqs {
		ls := s.stats[reqs[i].Limit]
		if ls == nil {
			n := s.names[reqs[i].Limit]
			ls = st.sess.limit(n[0], n[1])
			s.stats[reqs[i].Limit] = ls
		}
		ls.Shadow = ls.Shadow || reqs[i].Shadow
		ls.observe(reqs[i].Key, reqs[i].Cost, out[i].Allowed, st.now)
		if li := st.sess.infos[[2]string{ls.Zone, ls.Scope}]; li != nil {
			for _, h := range li.Headers {
				if len(st.entry.Header[h]) == 0 {
					ls.Absent[h]++
				}
			}
			if li.Response {
				st.observed = append(st.observed, ls)
			}
		}
	}
	return ok, nil
}

// Refund gives back at the request's time.
func (s *replayStore) Refund(ctx context.Context, reqs []backend.Request, granted []algorithms.Result) error {
	if st := stateOf(ctx); st != nil {
		s.t.Store(st.now)
	}
	return s.Store.Refund(ctx, reqs, granted)
}

// responder answers in place of the handler that answered live: with the
// log's status and response header fields.
type responder struct{}

// CaddyModule returns the Caddy module information.
func (responder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers." + responderModule, New: func() caddy.Module { return new(responder) }}
}

func (*responder) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	return answer(w, r)
}

// refusedLive tells whether the log's answer was a rate limiter's
// refusal: an error status with Retry-After.
func refusedLive(e *Entry) bool {
	return e.Status >= 400 && e.hasRespHeader("Retry-After")
}

func answer(w http.ResponseWriter, r *http.Request) error {
	st := stateOf(r.Context())
	if st == nil {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	st.reached = true
	e := st.entry
	status := e.Status
	switch {
	case refusedLive(e):
		// Refused live, admitted here: what the upstream would have
		// answered is not in the log.
		st.unknown = true
		status = http.StatusOK
	case status == 0:
		status = http.StatusOK
	}
	if st.sess.response && !st.unknown {
		h := w.Header()
		for k, v := range e.RespHeader() {
			h[k] = v
		}
	}
	w.WriteHeader(status)
	return nil
}

// recorder is the response writer of a replayed request.
type recorder struct {
	h      http.Header
	status int
}

func (w *recorder) Header() http.Header { return w.h }
func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *recorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// replayMu keeps replays of one process apart: zones of one name share
// their state process-wide.
var replayMu sync.Mutex

// Replay provisions cfg (a plan's JSON, or a variant of it) and decides
// every line of the logs through it.
func Replay(plan *Plan, cfg []byte, opts Options, peaks bool) (*Result, error) {
	replayMu.Lock()
	defer replayMu.Unlock()
	Register()
	start := time.Now()
	sess := &session{response: plan.Response, limits: map[[2]string]*LimitStats{}, infos: map[[2]string]*LimitInfo{}, peaks: peaks}
	for _, z := range plan.Zones {
		for _, l := range z.Limits {
			sess.infos[[2]string{l.Zone, l.Scope}] = l
		}
	}
	var c caddy.Config
	if err := json.Unmarshal(cfg, &c); err != nil {
		return nil, err
	}
	ctx, err := caddy.ProvisionContext(&c)
	if err != nil {
		return nil, fmt.Errorf("loading the config: %v", err)
	}
	appAny, err := ctx.App("http")
	if err != nil {
		return nil, fmt.Errorf("loading the config: %v", err)
	}
	app := appAny.(*caddyhttp.App)
	var cleanups []caddy.CleanerUpper
	defer func() {
		for _, c := range cleanups {
			_ = c.Cleanup()
		}
	}()
	var visit func(caddyhttp.RouteList)
	visit = func(routes caddyhttp.RouteList) {
		for _, r := range routes {
			for _, h := range r.Handlers {
				switch h := h.(type) {
				case *caddyhttp.Subroute:
					visit(h.Routes)
				default:
					if _, ok := h.(*responder); ok {
						continue
					}
					if opts.Prepare != nil {
						opts.Prepare(h, sess.clock.Load)
					}
					if c, ok := h.(caddy.CleanerUpper); ok {
						cleanups = append(cleanups, c)
					}
				}
			}
		}
	}
	chains := map[string]caddyhttp.Handler{}
	servers := map[string]*caddyhttp.Server{}
	for name, srv := range app.Servers {
		visit(srv.Routes)
		chains[name] = srv.Routes.Compile(caddyhttp.HandlerFunc(answer))
		servers[name] = srv
	}
	fallback := opts.Server
	if fallback != "" && servers[fallback] == nil {
		return nil, fmt.Errorf("--server %q: the config has no such server (it has %v)", fallback, plan.Servers)
	}
	if fallback == "" {
		fallback = plan.Servers[0]
	}

	m, err := NewMerger(opts.Logs, opts.Reorder)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	res := &Result{Files: m.Files(), Refused: map[int]int64{}, RefusedBy: map[string]int64{}, UnroutedServer: fallback}
	st := &reqState{sess: sess}
	base := context.WithValue(context.Background(), ctxKey{}, st)
	w := &recorder{h: http.Header{}}
	var dec *bufio.Writer
	if opts.Decisions != nil {
		dec = bufio.NewWriterSize(opts.Decisions, 64<<10)
	}
	first := true
	for {
		e, err := m.Next()
		if err != nil {
			return nil, err
		}
		if e == nil {
			break
		}
		name, ok := plan.Loggers[e.Logger]
		if !ok || name == "" {
			name = fallback
			res.Unrouted++
		}
		r, err := buildRequest(base, e)
		if err != nil {
			res.Malformed++
			if len(res.MalformedExamples) < keepMalformed {
				res.MalformedExamples = append(res.MalformedExamples, Malformed{File: res.Files[e.File], Line: e.Line, Error: err.Error()})
			}
			continue
		}
		if first {
			res.First, first = e.At, false
		}
		res.Last = e.At
		st.entry, st.now, st.reached, st.unknown, st.observed = e, e.At, false, false, st.observed[:0]
		sess.clock.Store(e.At)
		clear(w.h)
		w.status = 0
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, w, servers[name])
		if e.Client != "" {
			if vars, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
				vars[caddyhttp.ClientIPVarKey] = e.Client
			}
		}
		if e.UserID != "" {
			repl.Set("http.auth.user.id", e.UserID)
		}
		herr := chains[name].ServeHTTP(w, r)
		status, refused := http.StatusOK, false
		switch {
		case st.reached:
			status = w.status
		case herr != nil:
			status, refused = http.StatusInternalServerError, true
			var he caddyhttp.HandlerError
			if errors.As(herr, &he) && he.StatusCode != 0 {
				status = he.StatusCode
			}
		case w.status != 0:
			status, refused = w.status, w.status >= 400
		}
		zone := ""
		if refused {
			res.Refused[status]++
			zone, _ = repl.GetString("http.rate_limit.exceeded.name")
			if zone == "" {
				zone, _ = repl.GetString("http.rate_limit.denylisted.name")
			}
			res.RefusedBy[zone]++
		} else {
			res.Passed++
			if st.unknown {
				for _, ls := range st.observed {
					ls.Unknown++
				}
			}
		}
		if dec != nil {
			writeDecision(dec, res.Files[e.File], e, status, zone)
		}
	}
	if dec != nil {
		if err := dec.Flush(); err != nil {
			return nil, err
		}
	}
	res.Lines, res.Entries, res.Other, res.Malformed, res.MalformedExamples = addCounts(m, res)
	res.Late, res.LongestLate = m.Late, m.Longest
	res.byKey = sess.limits
	for _, ls := range sess.limits {
		res.Limits = append(res.Limits, ls)
	}
	sort.Slice(res.Limits, func(i, j int) bool {
		a, b := res.Limits[i], res.Limits[j]
		if a.Zone != b.Zone {
			return a.Zone < b.Zone
		}
		return a.Scope < b.Scope
	})
	res.Elapsed = time.Since(start)
	return res, nil
}

func addCounts(m *Merger, res *Result) (lines, entries, other, malformed int64, examples []Malformed) {
	lines, entries, other, malformed, examples = m.Counts()
	malformed += res.Malformed
	examples = append(examples, res.MalformedExamples...)
	if len(examples) > keepMalformed {
		examples = examples[:keepMalformed]
	}
	return
}

// buildRequest makes the request of e as Caddy's server would have it.
func buildRequest(ctx context.Context, e *Entry) (*http.Request, error) {
	var u *url.URL
	var err error
	if e.URI == "*" {
		u = &url.URL{Path: "*"}
	} else if u, err = url.ParseRequestURI(e.URI); err != nil {
		return nil, fmt.Errorf("uri: %v", err)
	}
	major, minor, ok := http.ParseHTTPVersion(e.Proto)
	if !ok {
		major, minor = 1, 1
	}
	r := (&http.Request{
		Method: e.Method, URL: u, Proto: e.Proto, ProtoMajor: major, ProtoMinor: minor,
		Header: e.Header, Host: e.Host, RequestURI: e.URI, Body: http.NoBody,
		RemoteAddr: net.JoinHostPort(e.RemoteIP, e.RemotePort),
	}).WithContext(ctx)
	if cl := e.Header.Get("Content-Length"); cl != "" {
		r.ContentLength, _ = strconv.ParseInt(cl, 10, 64)
	}
	if e.TLS != nil {
		r.TLS = &tls.ConnectionState{
			Version: e.TLS.Version, CipherSuite: e.TLS.CipherSuite, NegotiatedProtocol: e.TLS.Proto,
			ServerName: e.TLS.ServerName, HandshakeComplete: true,
		}
	}
	return r, nil
}

// Decision is one replayed request, as --decisions writes it.
type Decision struct {
	File   string `json:"file"`
	Line   int64  `json:"line"`
	At     string `json:"at"`
	Method string `json:"method"`
	Host   string `json:"host"`
	URI    string `json:"uri"`
	Logged int    `json:"logged"`
	Status int    `json:"status"`
	Zone   string `json:"zone,omitempty"`
}

func writeDecision(w *bufio.Writer, file string, e *Entry, status int, zone string) {
	b, _ := json.Marshal(Decision{
		File: file, Line: e.Line, At: time.Unix(0, e.At).UTC().Format(time.RFC3339Nano),
		Method: e.Method, Host: e.Host, URI: e.URI, Logged: e.Status, Status: status, Zone: zone,
	})
	w.Write(b)
	w.WriteByte('\n')
}
