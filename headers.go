package sluice

import (
	"encoding/base64"
	"fmt"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
)

// Values of the headers option: which rate limit header fields a response
// carries.
const (
	HeadersNone   = "none"
	HeadersDraft  = "draft"
	HeadersLegacy = "legacy"
	HeadersBoth   = "both"
)

// headerSet is a headers mode as bits, so that each family of fields can
// pick the limits that send it.
type headerSet uint8

const (
	sendDraft headerSet = 1 << iota
	sendLegacy
)

func parseHeaders(mode string) (headerSet, error) {
	switch mode {
	case "", HeadersNone:
		return 0, nil
	case HeadersDraft:
		return sendDraft, nil
	case HeadersLegacy:
		return sendLegacy, nil
	case HeadersBoth:
		return sendDraft | sendLegacy, nil
	}
	return 0, fmt.Errorf("headers must be draft, legacy, both or none, got %q", mode)
}

// sfMaxInteger is the largest Integer a structured field can carry (RFC
// 9651: at most 15 digits). A quota of 10^15 is sent as this. (Some
// parsers, such as httpsfv v1.1.1's, refuse a 15-digit integer that
// another parameter follows: quotas from 10^14 up are read by those as a
// malformed field, which the draft tells clients to ignore.)
const sfMaxInteger = 999_999_999_999_999

// The fields' names as the draft and the older convention spell them.
// They are set as map keys directly: http.Header.Set would write Go's
// canonical "Ratelimit-Policy", and while field names are case-insensitive,
// the spelling is what operators and some clients look for. HTTP/2 and 3
// send every name in lower case whatever the key. A Go lookup by the
// canonical name (Header.Get, Caddy's `header -Name`) does not find these
// keys; Caddy's wildcard deletes (`header -RateLimit*`) ignore case and do.
const (
	hdrPolicy          = "RateLimit-Policy"
	hdrRateLimit       = "RateLimit"
	hdrLegacyLimit     = "X-RateLimit-Limit"
	hdrLegacyRemaining = "X-RateLimit-Remaining"
	hdrLegacyReset     = "X-RateLimit-Reset"
)

// limitHeaders is what a limit writes into the rate limit fields, prepared
// at provision so that a request only appends numbers.
type limitHeaders struct {
	send headerSet
	// name is the policy's name serialized as a structured-field String:
	// the zone, or "zone.scope".
	name string
	// policy is the limit's RateLimit-Policy item without a partition key.
	policy string
	q, w   int64
	// partitioned limits hash their keys: the key is the HMAC of the
	// identifier, safe to send back as the item's partition key.
	partitioned bool
}

// provisionHeaders prepares l's items for the modes its zone sends.
func (l *limit) provisionHeaders(send headerSet) error {
	l.hdr = limitHeaders{send: send}
	if send == 0 {
		return nil
	}
	// A tier's limit goes by its scope's name: a client sees one tier.
	name := l.zone.name
	if l.shownScope() != "" {
		name += "." + l.shownScope()
	}
	p := l.policy()
	quota := algorithms.MaxCost(l.algorithm, p)
	q := min(quota, sfMaxInteger)
	// w is the time the whole quota takes to come back: the window, or for
	// the buckets the time to refill it at max_events per window (burst 10
	// at 5/s: 2 s). In 128 bits: quota × window can pass 2^63; the
	// quotient is at most about 2^61 ns, as provisioning bounds it.
	span := p.Window
	if algorithms.UsesBurst(l.algorithm) {
		span = algorithms.MaxSpan
		if hi, lo := bits.Mul64(uint64(quota), uint64(p.Window)); hi < uint64(p.Limit) {
			quo, _ := bits.Div64(hi, lo, uint64(p.Limit))
			span = int64(min(quo, uint64(algorithms.MaxSpan)))
		}
	}
	w := max(secondsUp(span), 1)
	l.hdr = limitHeaders{send: send, q: q, w: w, partitioned: l.Hash != ""}
	if send&sendDraft == 0 {
		return nil
	}
	params := httpsfv.NewParams()
	params.Add("q", q)
	params.Add("w", w)
	var err error
	if l.hdr.policy, err = httpsfv.Marshal(httpsfv.Item{Value: name, Params: params}); err != nil {
		return fmt.Errorf("headers: the policy name %q cannot be sent in a RateLimit-Policy field (printable ASCII only): %v", name, err)
	}
	l.hdr.name, err = httpsfv.Marshal(httpsfv.Item{Value: name, Params: httpsfv.NewParams()})
	return err
}

func secondsUp(ns int64) int64 { return (ns + int64(time.Second) - 1) / int64(time.Second) }

// writeHeaders sets the rate limit fields of a decided request, allowed or
// denied, on w: the policies of every enforcing limit whose zone sends
// them, and the numbers of the one closest to denying. A zone that sends
// none is left out of every field, even when others send them.
func writeHeaders(w http.ResponseWriter, limits []*limit, reqs []backend.Request, out []algorithms.Result) {
	var sent headerSet
	denied, shownDenied := false, false
	for i, l := range limits {
		if !l.zone.Shadow {
			sent |= l.hdr.send
			denied = denied || !out[i].Allowed
			shownDenied = shownDenied || !out[i].Allowed && l.hdr.send != 0
		}
	}
	// Refused by a zone that shows no numbers (a login zone, whose counts
	// would guide an attacker), the request would carry only the numbers
	// of zones that allowed it: a remaining quota that a client reading
	// the fields would retry on at once. Only the policies are sent.
	numbers := !denied || shownDenied
	// One backing array for every value slice the fields need.
	n := 0
	if sent&sendDraft != 0 {
		n += 2
	}
	if sent&sendLegacy != 0 && numbers {
		n += 3
	}
	if n == 0 {
		return
	}
	vals := make([]string, n)
	set := func(name, v string) {
		vals[0] = v
		w.Header()[name] = vals[:1:1]
		vals = vals[1:]
	}
	if sent&sendDraft != 0 {
		set(hdrPolicy, policyField(limits, reqs))
		if i := reported(limits, out, sendDraft); i >= 0 && numbers {
			l := limits[i]
			// Room for any item without growing: the value is the one
			// allocation.
			var buf [128]byte
			b := append(buf[:0], l.hdr.name...)
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, min(remaining(out[i], reqs[i].Cost, denied), sfMaxInteger), 10)
			if t, ok := resetSeconds(out[i]); ok {
				b = append(b, ";t="...)
				b = strconv.AppendInt(b, min(t, sfMaxInteger), 10)
			}
			b = appendPartitionKey(b, l, reqs[i].Key)
			set(hdrRateLimit, string(b))
		}
	}
	if sent&sendLegacy != 0 && numbers {
		if i := reported(limits, out, sendLegacy); i >= 0 {
			t, _ := resetSeconds(out[i])
			set(hdrLegacyLimit, intText(limits[i].hdr.q))
			set(hdrLegacyRemaining, intText(min(remaining(out[i], reqs[i].Cost, denied), limits[i].hdr.q)))
			set(hdrLegacyReset, intText(t))
		}
	}
}

// policyField is the RateLimit-Policy value: the item of every enforcing
// limit that sends it. One limit without a partition key has its item
// ready from provision.
func policyField(limits []*limit, reqs []backend.Request) string {
	only := -1
	for i, l := range limits {
		if l.zone.Shadow || l.hdr.send&sendDraft == 0 {
			continue
		}
		if only >= 0 || l.hdr.partitioned {
			only = -2
			break
		}
		only = i
	}
	if only >= 0 {
		return limits[only].hdr.policy
	}
	var buf [256]byte
	b := buf[:0]
	for i, l := range limits {
		if l.zone.Shadow || l.hdr.send&sendDraft == 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, l.hdr.policy...)
		b = appendPartitionKey(b, l, reqs[i].Key)
	}
	return string(b)
}

// appendPartitionKey adds the pk parameter of a limit that hashes its keys:
// the HMAC bytes as a Byte Sequence. A key that was not hashed (a missing
// value shared under "shared", or a key too long that was SHA-256'd) is
// not sent.
func appendPartitionKey(b []byte, l *limit, key string) []byte {
	mac, ok := strings.CutPrefix(key, "hmac:")
	if !l.hdr.partitioned || !ok {
		return b
	}
	raw, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil {
		return b
	}
	params := httpsfv.NewParams()
	params.Add("pk", raw)
	s, err := httpsfv.Marshal(params)
	if err != nil {
		return b
	}
	return append(b, s...)
}

// reported is the limit whose numbers the RateLimit (or X-RateLimit-*)
// fields carry, among those sending the family: the shown limit that
// denied with the longest wait, else the one with the least room left, so
// that on a denial t is Retry-After (before jitter) whenever the limit that
// set it is shown. -1 when none is shown.
func reported(limits []*limit, out []algorithms.Result, family headerSet) int {
	best := -1
	for i, l := range limits {
		if l.zone.Shadow || l.hdr.send&family == 0 {
			continue
		}
		a, b := out[i], algorithms.Result{}
		if best >= 0 {
			b = out[best]
		}
		switch {
		case best < 0,
			!a.Allowed && b.Allowed,
			!a.Allowed && !b.Allowed && later(a.RetryAfter, b.RetryAfter),
			a.Allowed && b.Allowed && tighter(a, b):
			best = i
		}
	}
	return best
}

// remaining is what a limit has left after the request. A limit that
// allowed a request that another denied was not charged: its result counts
// the cost as taken, so it is given back (up to the quota; a cost can be up
// to 2^63 − 1).
func remaining(res algorithms.Result, cost int64, denied bool) int64 {
	if !denied || !res.Allowed {
		return res.Remaining
	}
	if cost > res.Limit-res.Remaining {
		return res.Limit
	}
	return res.Remaining + cost
}

// tighter reports whether a has a smaller share of its quota left than b.
// In floats: the products of two int64 counts could overflow.
func tighter(a, b algorithms.Result) bool {
	return float64(a.Remaining)*float64(b.Limit) < float64(b.Remaining)*float64(a.Limit)
}

// resetSeconds is the t of a limit's result: on a denial the wait before
// the same request can pass (Retry-After before jitter), else the time
// until the quota is whole again. A cost that can never pass has no such
// time: ok is false and the time until the quota is whole is returned.
func resetSeconds(res algorithms.Result) (int64, bool) {
	switch {
	case res.Allowed:
		return secondsUp(res.ResetAfter), true
	case res.RetryAfter == algorithms.Never:
		return secondsUp(res.ResetAfter), false
	}
	return retryAfterSeconds(time.Duration(res.RetryAfter)), true
}
