package sluice

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/shed"
)

// watcher is the one wrapper of an admitted request's response, put in
// place only when a configured feature needs what the response says. It
// hands the response on as it is written, never buffering it (a streamed
// answer stays streamed), and serves two kinds of watching:
//
//   - the outcome (outcome): the limits that count, reset, charge or
//     settle by the response note its status and fields as they are
//     written, and settle once it is known (outcome.go, budget.go,
//     settle.go);
//   - the latency (timed): adaptive limits and a shedding group with a
//     latency target time the handlers after this one, less the time
//     spent on the client (adaptive.go, shed.go).
//
// Watchers are pooled: one per request would be an allocation on every
// request these features let through.
type watcher struct {
	caddyhttp.ResponseWriterWrapper
	h              *plan // whose request it watches: its logger, clock and timers
	outcome, timed bool

	// The outcome's. status is the first final status (a flush sends
	// 200); an int32 so that left and the masks fit beside it. It holds
	// copies of the watched limits' requests and decisions, because the
	// request's state goes back to the pool before the request is
	// handed on.
	status int32
	left   bool // the client had gone when the status was written
	// counted and reset hold, for the first maskLimits limits, whether
	// count_when and reset_when matched when the status was written: the
	// header fields as the application wrote them, before a handler
	// around this one removes some on their way out (header -Field).
	counted, reset uint8
	charged        uint8         // the same for charge_when (budget.go)
	store          backend.Store // the store that decided
	settle         *settleNotes  // nil unless a limit settles its cost
	notes          settleNotes
	// holdUntil, on the handler's clock, is when the first of the
	// request's spend budget reservations expires; 0 without one. hold
	// keeps such a request's call going once its client left (budget.go).
	holdUntil int64
	hold      *budgetHold
	limits    []*limit
	reqs      []backend.Request
	out       []algorithms.Result
	// Room for the usual one or two such limits.
	limitBuf [2]*limit
	reqBuf   [2]backend.Request
	outBuf   [2]algorithms.Result
	detached detachedContext

	// The latency's. sent is the first final status written (a flush
	// alone sets none), by which a request failed or not; hijacked is set
	// when a handler took the connection over.
	sent     int32
	hijacked bool
	// now is the limits' clock; client is the time spent waiting on the
	// client: reading its body, writing the answer to it. It is not the
	// upstream's: a client that uploads or reads slowly must not make the
	// upstream look slow and drive the limit down for everyone.
	now    func() int64
	client atomic.Int64
	adapt  []*adaptiveLimit
	// For a shedding group's latency (group, when the watcher times the
	// request for one), which leaves out besides the waits of a tarpit,
	// a queue or a max_delay behind this handler: paused is their total,
	// pausedAt when the current one began. refused is set when a
	// rate_limit behind refused the request: its answer took no upstream
	// time.
	group            *shed.Group
	paused, pausedAt int64
	refused          bool
	adaptBuf         [4]*adaptiveLimit
}

var watchers = sync.Pool{New: func() any { return new(watcher) }}

// detachedContext is context.WithoutCancel's behaviour, kept inside the
// watcher: the refund and reset run after the response whether the client
// stayed or not, and WithoutCancel would allocate its context on every
// settled request.
type detachedContext struct{ parent context.Context }

func (detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedContext) Done() <-chan struct{}       { return nil }
func (detachedContext) Err() error                  { return nil }
func (c *detachedContext) Value(key any) any        { return c.parent.Value(key) }

// newWatcher returns the watcher of a request of h admitted with the
// decisions in s, taken from the pool, or nil when nothing needs its
// response: no limit of s counts, resets, charges or settles by the
// response (outcome), and neither an adaptive limit nor the shedding group
// timed (nil unless this handler times the request for its group)
// measures its latency. It is called only when h is watching.
func newWatcher(h *plan, w http.ResponseWriter, s *requestState, timed *shed.Group) *watcher {
	latency := len(s.adapt) > 0 || timed != nil
	outcome := h.outcomes && slices.ContainsFunc(s.limits, (*limit).byResponse)
	if !latency && !outcome {
		return nil
	}
	x := watchers.Get().(*watcher)
	x.ResponseWriter, x.h = w, h
	if latency {
		x.timed = true
		x.adapt = append(x.adaptBuf[:0], s.adapt...)
		x.group = timed
		if len(s.adapt) > 0 {
			x.now = s.adapt[0].now
		} else {
			x.now = timed.Now
		}
	}
	if !outcome {
		return x
	}
	x.outcome, x.store = true, s.store
	x.limits, x.reqs, x.out = x.limitBuf[:0], x.reqBuf[:0], x.outBuf[:0]
	for i, l := range s.limits {
		if !l.byResponse() {
			continue
		}
		if l.settle != nil {
			x.settle = &x.notes
		}
		x.limits = append(x.limits, l)
		x.reqs = append(x.reqs, s.reqs[i])
		x.out = append(x.out, s.out[i])
		// A shadow zone's budget observes: it does not change how the
		// request is handed on.
		if l.ChargeWhen != nil && s.reqs[i].Reserve > 0 && !l.zone.Shadow {
			if until := s.at + s.reqs[i].Reserve; x.holdUntil == 0 || until < x.holdUntil {
				x.holdUntil = until
			}
		}
	}
	return x
}

// byResponse tells whether l counts, resets, charges or settles by the
// response.
func (l *Limit) byResponse() bool {
	return l.CountWhen != nil || l.ResetWhen != nil || l.ChargeWhen != nil || l.Settle != ""
}

// serve hands r on through x, settles what the response decides, then
// records the latency it measured. x goes back to the pool: nothing that
// may outlive the request (a spend budget's context) points into it.
func (x *watcher) serve(r *http.Request, next caddyhttp.Handler) error {
	var start int64
	body := r.Body
	var timedBody *clientBody
	if x.timed {
		if body != nil && body != http.NoBody {
			timedBody = &clientBody{ReadCloser: body, now: x.now}
			r.Body = timedBody
		}
		start = x.now()
	}
	var err error
	if x.outcome {
		err = x.serveOutcome(r, next)
	} else {
		err = next.ServeHTTP(x, r)
	}
	if x.timed {
		end := x.now()
		r.Body = body
		x.observe(r, err, start, end, timedBody)
	}
	*x = watcher{}
	watchers.Put(x)
	return err
}

// observe gives the latency of the request, from start to end, to its
// adaptive limits and its shedding group.
func (x *watcher) observe(r *http.Request, err error, start, end int64, timedBody *clientBody) {
	// A connection that switched protocols (a WebSocket) lasts as long as
	// its client stays: its length says nothing of the upstream's speed.
	if x.hijacked || x.sent == http.StatusSwitchingProtocols {
		return
	}
	failed := requestFailed(int(x.sent), err, r)
	// The body is read while the upstream waits for it (a proxy sends it
	// as it comes): that wait is the client's.
	waited := x.client.Load()
	if timedBody != nil {
		waited += timedBody.ns.Load()
	}
	latency := max(end-start-waited, 0)
	for _, a := range x.adapt {
		a.observe(latency, failed, end)
	}
	if g := x.group; g != nil && !x.refused {
		g.Observe(max(latency-x.paused, 0), end)
	}
}

// isFinal tells a status that ends the exchange: informational answers (103
// Early Hints) come before the real one, while 101 ends it.
func isFinal(code int) bool {
	return code >= 200 || code == http.StatusSwitchingProtocols
}

// WriteHeader notes the first final status.
func (x *watcher) WriteHeader(code int) {
	first := x.outcome && x.status == 0 && isFinal(code)
	if first {
		x.note(code)
	}
	if x.sent == 0 && isFinal(code) {
		x.sent = int32(code) // WriteHeader panics on codes past 999
	}
	x.ResponseWriter.WriteHeader(code)
	if first {
		x.settleChargesEarly()
	}
}

// A body written without WriteHeader goes out as 200.
func (x *watcher) Write(b []byte) (int, error) {
	x.wrote()
	if !x.timed {
		return x.ResponseWriter.Write(b)
	}
	start := x.now()
	n, err := x.ResponseWriter.Write(b)
	x.client.Add(x.now() - start)
	return n, err
}

func (x *watcher) ReadFrom(r io.Reader) (int64, error) {
	x.wrote()
	if !x.timed {
		return x.ResponseWriterWrapper.ReadFrom(r)
	}
	// Counted whole as the client's: the sources copied this way are
	// files (file_server), read at the disk's pace, and wrapping the
	// source to time it apart would lose sendfile.
	start := x.now()
	n, err := x.ResponseWriterWrapper.ReadFrom(r)
	x.client.Add(x.now() - start)
	return n, err
}

// FlushError lets http.ResponseController flush a streamed response.
func (x *watcher) FlushError() error {
	if x.outcome && x.status == 0 {
		x.note(http.StatusOK)
		x.settleChargesEarly()
	}
	if !x.timed {
		return http.NewResponseController(x.ResponseWriter).Flush()
	}
	start := x.now()
	err := http.NewResponseController(x.ResponseWriter).Flush()
	x.client.Add(x.now() - start)
	return err
}

// Hijack is for the handlers that still assert http.Hijacker.
func (x *watcher) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	x.hijacked = true
	return http.NewResponseController(x.ResponseWriter).Hijack()
}

// wrote notes the 200 of a body written without a status.
func (x *watcher) wrote() {
	if x.outcome && x.status == 0 {
		x.note(http.StatusOK)
		x.settleChargesEarly()
	}
	if x.sent == 0 {
		x.sent = http.StatusOK
	}
}

// maskLimits is how many limits' matches the watcher notes when the
// status is written; the matchers of any further ones see the fields as
// they are once the response is over.
const maskLimits = 8

// note records the final status, whether the client had left, and which
// matchers match the response as it is about to go out.
func (x *watcher) note(code int) {
	x.status = int32(code) // WriteHeader panics on codes past 999
	x.left = x.detached.parent != nil && x.detached.parent.Err() != nil
	hdr := x.Header()
	x.noteSettle(hdr)
	for i, l := range x.limits[:min(len(x.limits), maskLimits)] {
		if l.CountWhen != nil && l.CountWhen.Match(code, hdr) {
			x.counted |= 1 << i
		}
		if l.ResetWhen != nil && l.ResetWhen.Match(code, hdr) {
			x.reset |= 1 << i
		}
		if l.ChargeWhen != nil && l.ChargeWhen.Match(code, hdr) {
			x.charged |= 1 << i
		}
	}
}

// matches reports whether m of the i-th limit matches the response:
// as noted when the status was written, else now.
func (x *watcher) matches(m *caddyhttp.ResponseMatcher, noted uint8, i, status int) bool {
	if m == nil {
		return false
	}
	if x.status != 0 && i < maskLimits {
		return noted&(1<<i) != 0
	}
	return m.Match(status, x.Header())
}

// finalStatus is the status the client gets: the one written, else the
// status of the error the handlers after this one returned (the error
// routes answer with it, as a reverse proxy's 502), else 200.
func (x *watcher) finalStatus(err error) int {
	if x.status != 0 {
		return int(x.status)
	}
	if err == nil {
		return http.StatusOK
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// clientBody times the reads of the request's body. It is not pooled: a
// transport may still read the body after the handlers returned.
type clientBody struct {
	io.ReadCloser
	now func() int64
	ns  atomic.Int64
}

func (b *clientBody) Read(p []byte) (int, error) {
	start := b.now()
	n, err := b.ReadCloser.Read(p)
	b.ns.Add(b.now() - start)
	return n, err
}

// requestFailed tells whether a request ended in a server error: a 5xx
// written, or an error from a handler (Caddy answers it with its status,
// 500 when it has none). A client that left is not the server's failure.
func requestFailed(status int, err error, r *http.Request) bool {
	if status != 0 {
		return status >= 500
	}
	if err == nil || r.Context().Err() != nil {
		return false
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode >= 500
	}
	return true
}

// settleNotes is what the watcher of a settled request notes as the
// status is written: the values of the settled fields of its first
// limits, before a handler around this one changes them on their way out.
type settleNotes struct {
	vals  [maxSettleNoted][]string
	noted uint8 // which of vals were noted
	// actual is the argument of Settle, here so that it does not escape
	// on its own.
	actual [1]int64
}

const maxSettleNoted = 2

// noteSettle notes the settled fields as the status is written.
func (o *watcher) noteSettle(hdr http.Header) {
	n := o.settle
	if n == nil {
		return
	}
	for i, l := range o.limits[:min(len(o.limits), maxSettleNoted)] {
		if l.settle != nil && l.settle.field != "" {
			n.vals[i] = hdr[l.settle.field]
			n.noted |= 1 << i
		}
	}
}

// settleValues are the values of l's settle field for the i-th limit: the
// header field as written with the status, else the trailer. A proxy puts
// a trailer it did not declare before the body (reverse_proxy copying an
// upstream's) under the trailer prefix; a declared one is set under its
// own name after the body, when it was not a header at the status.
func (o *watcher) settleValues(l *limit, i int) []string {
	s := l.settle
	hdr := o.Header()
	n := o.settle
	noted := n != nil && i < maxSettleNoted && n.noted&(1<<i) != 0
	var atStatus []string
	if noted {
		atStatus = n.vals[i]
	} else if !s.trailerOnly {
		atStatus = hdr[s.field]
	}
	if atStatus != nil && !s.trailerOnly {
		return atStatus
	}
	if v := hdr[s.trailer]; v != nil {
		return v
	}
	if noted && atStatus == nil {
		return hdr[s.field]
	}
	return nil
}

// actual reads the real cost of the i-th limit's request, or false when
// the response does not give one that can be trusted.
func (o *watcher) actual(r *http.Request, l *limit, i int) (int64, string, bool) {
	var v string
	if l.settle.field != "" {
		vals := o.settleValues(l, i)
		switch len(vals) {
		case 0:
			return 0, "missing", false
		case 1:
			v = vals[0]
		default:
			return 0, "given more than once", false
		}
	} else {
		repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if repl == nil {
			return 0, "missing", false
		}
		x, _ := repl.Get(l.settle.name)
		switch x := x.(type) {
		case nil:
			return 0, "missing", false
		case string:
			v = x
		case int:
			v = strconv.Itoa(x)
		case int64:
			v = strconv.FormatInt(x, 10)
		default:
			v = fmt.Sprint(x)
		}
	}
	n, ok := parseSettleValue(v)
	if !ok {
		return 0, "not a whole number from 0 to 10^15", false
	}
	return n, "", true
}
