package sluice

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/internal/keys"

	// The shuffle_shard load-balancing policy ships with the handler.
	// The stores register themselves as backend modules.
	_ "github.com/sluicehq/sluice/backend/memory"
	_ "github.com/sluicehq/sluice/backend/redis"
	_ "github.com/sluicehq/sluice/shard"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests, per zone and per key.
//
// A request is checked against every zone whose matchers it satisfies and is
// decided once, all or nothing: when any zone denies it, no zone consumes
// anything. A denied request gets HTTP 429 with a Retry-After header, as an
// error that `handle_errors` routes can shape; the placeholder
// `{http.rate_limit.exceeded.name}` holds the name of the zone that denied it.
//
// The JSON shape is a superset of mholt/caddy-ratelimit's, so its configs work
// unchanged and behave the same (an exact sliding window per zone).
type Handler struct {
	// RateLimits are the zones, keyed by name. Zones of the same name share
	// their state, across handlers and across config reloads, so give zones
	// of different handlers different names unless they should share.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Jitter adds a random extra wait of up to this fraction of the wait to
	// Retry-After (0.2 adds up to 20%), so that denied clients do not all
	// retry at the same instant. 0 or more; above 1 (more than doubling the
	// wait) a warning is logged, since `jitter 20` is usually meant as 20%.
	// Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// SweepInterval is how often keys that are back to idle are dropped from
	// memory. Default (and 0): 1m. Values under 1s are taken as 1s and values
	// over 24h as 24h, with a warning: a key back to idle has nothing left to
	// limit, so only memory and CPU see the difference.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// LogKey adds the key to the log line of a denied request. Off by
	// default because keys can hold personal data.
	LogKey bool `json:"log_key,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// BackendRaw is where the zones' state lives and requests are decided:
	// a module of the http.rate_limit.backends namespace, chosen by its
	// "name". "memory" keeps the state in this Caddy process (each instance
	// of a fleet limits on its own). Default: {"name": "memory"}.
	BackendRaw json.RawMessage `json:"backend,omitempty" caddy:"namespace=http.rate_limit.backends inline_key=name"`

	// Distributed shares the zones' counts with the other instances that
	// use the same storage, eventually consistent (see Distributed), as
	// mholt/caddy-ratelimit does. An empty object enables it with the
	// defaults. Default: unset, each instance limits on its own.
	Distributed *Distributed `json:"distributed,omitempty"`

	// StorageRaw is the Caddy storage module distributed syncs through.
	// Default: the storage of the Caddy config (file_system unless set).
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	// BodyLimit is how many bytes of a request body are read to find a key
	// or cost field ({http.request.body.json.*}, {http.request.body.form.*},
	// {http.request.body.field.*}), or the size of a body sent without
	// Content-Length ({http.request.body.size}). A larger body is
	// unreadable (its size too, when it declares none): it is never
	// skipped by missing "skip", and a cost read from it is answered with
	// 400. The body is always handed on unchanged. Default: 65536 (64 KiB);
	// at most 16777216 (16 MiB), since each request being read holds this
	// much.
	BodyLimit int64 `json:"body_limit,omitempty"`

	// Headers is which rate limit header fields allowed and denied
	// responses carry, for every zone that does not choose its own: "draft"
	// (RateLimit-Policy and RateLimit, as structured fields), "legacy"
	// (X-RateLimit-Limit, -Remaining and -Reset, in seconds), "both" or
	// "none". Default: "none", as mholt/caddy-ratelimit sends none.
	Headers string `json:"headers,omitempty"`

	// Respond makes Sluice write the body of every refusal itself (429,
	// 503 of a zone that fails closed, 400 for a missing key or a bad cost,
	// 403 for a deny list), without Caddy's error path: "json", "problem"
	// (application/problem+json) or "text". Default: unset, every refusal
	// is a Caddy error that handle_errors routes can shape.
	Respond string `json:"respond,omitempty"`

	// Shed makes this handler's requests part of a load shedding group,
	// with a priority: when the group has too many requests in flight
	// for its capacity, the lowest priorities are refused with 503.
	// Default: unset, never shed and not counted.
	Shed *Shed `json:"shed,omitempty"`

	// Tarpit holds the answer to a request a rate limit denies for up to
	// this long (between half and all of it, at random) before it is
	// written: a scraper's connection is kept busy instead of freed to
	// try again. At most 1m. Default: 0, denials are answered at once.
	Tarpit caddy.Duration `json:"tarpit,omitempty"`

	// TarpitMax caps how many denied requests the tarpit holds at once;
	// beyond it a denial is answered at once. A held request costs its
	// own connection and handler goroutine, nothing more. From 1 to
	// 1000000. Default: 1000 (with tarpit).
	TarpitMax int64 `json:"tarpit_max,omitempty"`

	// plan is what Provision compiled the config into, which requests
	// run on.
	plan *plan
}

// jitterWarnAbove is the jitter above which a warning says that the value
// is a fraction: mholt/caddy-ratelimit's Caddyfile syntax calls it a
// percent, so `jitter 20` may mean 20% where it adds up to 20 times the wait.
const jitterWarnAbove = 1

// minSweepInterval keeps the sweeper from spinning: each sweep walks every
// key.
const minSweepInterval = time.Second

// maxSweepInterval is the longest sweep interval: beyond a day, idle keys
// would leave memory only when max_keys evicts them.
const maxSweepInterval = 24 * time.Hour

// checkJitter refuses what no wait can be multiplied by. Any other value
// loads, as it did with mholt/caddy-ratelimit: the wait it gives is bounded
// where it is added.
func checkJitter(j float64) error {
	if math.IsNaN(j) || math.IsInf(j, 0) || j < 0 {
		return fmt.Errorf("jitter must be a fraction of the wait, 0 or more (0.2 adds up to 20%%), got %v", j)
	}
	return nil
}

// sweepInterval is si brought within the bounds the sweeper runs at, and
// whether it had to be.
func sweepInterval(si time.Duration) (time.Duration, bool) {
	switch {
	case si < minSweepInterval:
		return minSweepInterval, true
	case si > maxSweepInterval:
		return maxSweepInterval, true
	}
	return si, false
}

// MaxBodyLimit is the largest body_limit, in bytes: every request whose
// body is read for a key holds up to this much in memory until it is
// decided, so a flood of large bodies costs at most this much each.
const MaxBodyLimit = 16 << 20

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// Zone is one group of requests (match) limited by one rate, per key, and
// optionally by more rates on other keys (scopes), all decided together.
//
// The zone's own fields (key, max_events, window, …) are its first limit,
// the one mholt/caddy-ratelimit configs use. Scopes add limits over other
// keys for the same requests, for defense in depth: one endpoint limited per
// identifier, per IP, per subnet and globally, so that an attacker who
// rotates one of them still meets the others.
type Zone struct {
	// MatcherSetsRaw selects the requests this zone applies to; all of them
	// when empty.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	Limit

	// Scopes are more limits on the same requests, each with its own rate
	// and algorithm, keyed by a scope name. A request passes only if the
	// zone's own limit and every scope allow it; when one denies, none is
	// charged. Each scope keeps its own state. A scope without a key counts
	// the zone's key, with the zone's normalize, hash, prefixes and missing
	// unless it sets its own.
	Scopes map[string]*Limit `json:"scopes,omitempty"`

	// Allow lists client addresses and networks ("192.0.2.0/24") that the
	// zone does not apply to: they are neither counted nor limited, as for
	// a payment provider's webhook addresses. The client address is Caddy's
	// client_ip, which honours trusted_proxies.
	Allow []string `json:"allow,omitempty"`

	// AllowMatchRaw exempts requests that match these matcher sets, for
	// conditions other than an address (a header, an expression over
	// placeholders).
	AllowMatchRaw caddyhttp.RawMatcherSets `json:"allow_match,omitempty" caddy:"namespace=http.matchers"`

	// Deny lists client addresses and networks that the zone always
	// refuses, with 403 Forbidden.
	Deny []string `json:"deny,omitempty"`

	// DenyMatchRaw refuses requests that match these matcher sets, with
	// 403 Forbidden.
	DenyMatchRaw caddyhttp.RawMatcherSets `json:"deny_match,omitempty" caddy:"namespace=http.matchers"`

	// Shadow makes the zone decide and count, and log the requests it would
	// deny, but never deny one (nor refuse one for its deny list, a missing
	// key or a bad cost): for trying a limit on live traffic first.
	Shadow bool `json:"shadow,omitempty"`

	// NearLimit is the fraction of a limit used from which an allowed
	// request counts in caddy_rate_limit_near_limit_total: with 0.8, a
	// request that leaves its key under 20% of the limit (the bucket's
	// size for the bucket algorithms) is near it. The counter shows a limit
	// about to bite before anyone is refused. Between 0 and 1, exclusive;
	// default 0.8. It applies to the zone's own limit and to its scopes.
	NearLimit float64 `json:"near_limit,omitempty"`

	// Headers overrides the handler's headers option for this zone: "none"
	// keeps its numbers out of every response (a login or OTP zone, whose
	// remaining count would guide an attacker), even when other zones of
	// the request send theirs.
	Headers string `json:"headers,omitempty"`
}

// Limit is one rate over one key: the zone's own, or a scope's.
type Limit struct {
	// Key tells clients apart: each distinct value after placeholders are
	// replaced has its own quota. A static key ("global") makes one quota
	// for everyone; "{http.vars.client_ip}" one per client address (it
	// honours trusted_proxies; never key on X-Forwarded-For yourself).
	// Values that are IP addresses are written in canonical form (an
	// IPv4-mapped IPv6 address is its IPv4 address). Body fields are
	// placeholders too: {http.request.body.json.<path>} (JSON bodies),
	// {http.request.body.form.<field>} (URL-encoded and multipart forms)
	// and {http.request.body.field.<path>} (either, as the Content-Type
	// says).
	Key string `json:"key,omitempty"`

	// MaxEvents is how many events (units of cost) are allowed per Window.
	// Required; from 1 to 10^15 (at most 4,294,967,295 for
	// sliding_window).
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is the length of the window MaxEvents are counted over.
	// Required; positive and at most 2^61 ns (about 73 years).
	Window caddy.Duration `json:"window,omitempty"`

	// Burst is the bucket capacity of token_bucket, gcra and the
	// leaky_bucket meter: how many events may pass at once after a quiet
	// period. Default: MaxEvents; at most 10^15, and burst × window ÷
	// max_events at most 2^61 ns. The other algorithms reject it.
	Burst int64 `json:"burst,omitempty"`

	// Algorithm is how the limit counts: "sliding_window" (exact log of
	// events; the default, and mholt/caddy-ratelimit's behaviour),
	// "sliding_window_counter", "fixed_window", "token_bucket", "gcra" or
	// "leaky_bucket". docs/algorithms.md compares them.
	Algorithm string `json:"algorithm,omitempty"`

	// MaxDelay makes a leaky_bucket limit a queue: a request that arrives
	// before its slot waits for it, up to this long, instead of being
	// denied, so requests leave at a steady max_events per window, never
	// two at once. Only a request whose slot is further away is denied. A
	// client that gives up while last in line frees its slot.
	// Default: 0 (a meter that denies); max_delay + window ÷ max_events at
	// most 2^61 ns (about 73 years).
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// Cost is how many units one request consumes: a whole number (0 makes
	// requests free), or a placeholder that expands to one, such as
	// "{http.request.header.X-Cost}", "{http.request.body.json.tokens}" or
	// "{http.request.body.size}" (the body's bytes: its Content-Length, else
	// the bytes of a chunked or HTTP/2 body read within body_limit; larger,
	// it is unreadable), or a sum of numbers and placeholders with "+".
	// Default: 1. A constant cost may be at most what the limit holds
	// (max_events, burst, or the queue's size). A placeholder that is absent
	// (a header not sent, a field absent from a readable body) costs 1. One
	// that is unreadable or given twice (see Missing), or is not a whole
	// number ≥ 0, is answered with 400; a shadow zone logs it instead. One
	// above what the limit holds (up to any size) is denied with 429.
	Cost *Cost `json:"cost,omitempty"`

	// CostMin is the least a cost read from the request (a placeholder or
	// a sum) takes: an estimate that comes out lower (a field the request
	// leaves out, an absent placeholder's 1) is raised to it. Only with
	// such a cost, not a constant one; from 1 to what the limit holds.
	// Default: 0, no floor.
	CostMin int64 `json:"cost_min,omitempty"`

	// IPv4Prefix masks key values that are IPv4 addresses (IPv4-mapped
	// IPv6 included) to their network of this many bits: 24 puts
	// 192.0.2.0/24 in one bucket. In a composite key only the address part
	// is masked. From 0 to 32. Default: 0, the address itself.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix masks key values that are IPv6 addresses to their network
	// of this many bits; 64 is one customer's network (an ISP hands each
	// customer a /64, whose 2^64 addresses one client can rotate through).
	// From 0 to 128. Default: 0, the address itself.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Normalize turns the spellings of an identifier into one key before
	// it is used, applied in order to every placeholder value of the key:
	// "trim", "lower", "email" (the mailbox a mail server delivers to;
	// with aliases, Gmail dots and +tags dropped too), "phone" (E.164,
	// with a default region; digits of any script), "path" (decoded,
	// dot segments and ;params resolved) and "credentials" ("Bearer tok"
	// and "bearer  tok" are one key). "email", "phone", "path" and
	// "credentials" refuse values with control or invisible characters and
	// spellings that applications read in different ways. A value a normalizer
	// refuses counts as missing. Default: none.
	Normalize []Normalize `json:"normalize,omitempty"`

	// Hash replaces each key by its HMAC-SHA256 under this secret, so phone
	// numbers, emails or card numbers never appear in memory dumps, logs or
	// a shared store in clear. Write the secret as {env.NAME}: it is read
	// from the environment when the config loads, and must be at least 16
	// bytes. Keys longer than 256 bytes are replaced by their SHA-256 even
	// without a secret.
	Hash string `json:"hash,omitempty"`

	// Missing is what happens when the key cannot be built: a value is
	// absent (an empty placeholder, a body field absent or null in a
	// readable body, no body), unreadable (a body of another Content-Type,
	// a charset other than UTF-8, a byte order mark, a Content-Encoding,
	// over body_limit, invalid JSON or form data, an object where a value
	// was wanted), given twice (a repeated header, query parameter, cookie,
	// form field or JSON key) or refused by a normalizer. "shared" (the
	// default, and mholt/caddy-ratelimit's behaviour): all such requests
	// share one quota. "skip": requests whose value is absent are not
	// limited by this limit; all others share one quota. "deny": they are
	// answered 400 Bad Request.
	Missing string `json:"missing,omitempty"`

	// MaxKeys caps how many keys this limit tracks in memory. When a new
	// key arrives at the cap, keys that are back to idle go first, then the
	// key with the most quota left among a random sample. A key whose next
	// request would be denied is evicted only when no other key is left
	// (counted and logged), so a flood of new keys cannot unblock a client.
	// Default: sized for about 100 MB (3,276,800 keys for the bucket
	// algorithms; fewer for the others, depending on max_events and cost
	// for sliding_window). At most 1,073,741,824 (2^30).
	MaxKeys int `json:"max_keys,omitempty"`

	// Fail is what the limit does when its backend cannot decide (Redis
	// unreachable, slower than its timeout, or its circuit breaker open):
	// "open" admits the request (counted in
	// caddy_rate_limit_backend_failures_total), "closed" answers 503
	// Service Unavailable with Retry-After, "local" limits on an
	// in-process store of this instance alone. When a request's limits
	// disagree, one "closed" limit refuses it; otherwise the "local" ones
	// decide it and the "open" ones let it through. A scope without a
	// policy takes its zone's. The memory backend never fails. Default:
	// "open"; "closed" for a spend budget (charge_when).
	Fail string `json:"fail,omitempty"`

	// Lease makes each Caddy instance take this many units of a key from
	// the shared backend at once and spend them locally, so that a hot key
	// costs one call to Redis per Lease units instead of one per request.
	// The fleet may then admit up to instances × Lease units more than the
	// limit in a window (token_bucket, gcra, sliding_window) and hold as
	// many unused for a while. At most 1% of max_events (and at most
	// burst); only with backend redis; not with leaky_bucket, fail closed,
	// a shadow zone, or a key read from the body or normalized or hashed
	// as an account identifier: such limits guard logins and codes, where
	// every unit counts. Default: 0 (no lease).
	Lease int64 `json:"lease,omitempty"`

	// CountWhen makes the limit count only the requests whose response
	// matches (status codes, classes such as 4xx, header fields): a login
	// limit that counts failed passwords alone. The unit is still taken
	// before the request is handed on, so concurrent requests never get
	// past the limit, and given back once a response that does not match
	// is written. Default: unset, every admitted request counts.
	CountWhen *caddyhttp.ResponseMatcher `json:"count_when,omitempty"`

	// ResetWhen clears the key's state when the response matches: a
	// correct password forgives the failures before it (and the key's
	// lock-out level, with Lockout). Default: unset.
	ResetWhen *caddyhttp.ResponseMatcher `json:"reset_when,omitempty"`

	// ChargeWhen makes the limit a spend budget: a request's units are
	// reserved before it is handed on, committed when its response
	// matches (status 2xx: the paid call went through) and released
	// otherwise (an upstream error or timeout, a 5xx, a client that went
	// away). A denied request gets 503 (the limit's status if set, else
	// the zone's), and the limit fails closed unless its fail says
	// otherwise. Default: unset.
	ChargeWhen *caddyhttp.ResponseMatcher `json:"charge_when,omitempty"`

	// ReservationTTL is how long a charge_when reservation lasts when
	// nothing settles it (the Caddy that made it died, or the request
	// never ended): its units then come back by themselves. Default: 1m;
	// from 1s to 24h.
	ReservationTTL caddy.Duration `json:"reservation_ttl,omitempty"`

	// Align cuts a fixed_window limit's time into the calendar's "hour",
	// "day" or "month" of Timezone instead of windows from the Unix epoch:
	// the window must be 1h, 24h or 30d (720h) respectively, and each
	// calendar unit gets max_events, whatever its real length (a day of 23
	// or 25 hours when the clocks change, a month of 28 to 31 days).
	// Default: unset (epoch-aligned windows).
	Align string `json:"align,omitempty"`

	// Timezone is the IANA time zone of Align ("Asia/Dhaka",
	// "America/New_York"). Default: UTC.
	Timezone string `json:"timezone,omitempty"`
	// Settle reads the request's real cost from its response once it is
	// over, as one placeholder: {http.response.header.X-Tokens-Used} (the
	// header field as written with the status, else a trailer of that
	// name), {http.response.trailer.X-Tokens-Used} (a trailer only), or
	// any other placeholder known after the response. The cost taken
	// before the request was handed on is then an estimate: the
	// difference is given back when the real cost is lower (never more
	// than was taken), and charged when it is higher, even past the limit,
	// so that the key owes it and waits it out. A value that is missing,
	// given twice, or not a whole number from 0 to 10^15 keeps the
	// estimate (logged at most once a minute per limit). Not with
	// max_delay, nor with lease on a sliding_window. Default: unset, the
	// cost taken is final.
	Settle string `json:"settle,omitempty"`

	// Lockout locks a key out when the limit denies it: for the first
	// duration, every request of the key is denied (Retry-After says how
	// long is left), whatever the limit's own count says. A key denied
	// again once a lock-out has ended serves the next duration; the last
	// one repeats ("1m", "5m", "24h": 1m, then 5m, then 24h every time).
	// The level is forgotten once the key has gone the longest duration
	// past the end of its last lock-out without being denied; a response
	// that matches reset_when, or a reset through the admin API, clears
	// it at once. A request whose cost can never pass does not lock a key
	// out. Each duration is positive, at most 720h (30 days), and at least
	// the one before; at most 16 of them. Not with max_delay, lease, a
	// concurrency cap alone, or in a shadow zone. Default: none.
	Lockout []caddy.Duration `json:"lockout,omitempty"`

	// Concurrency caps how many requests of a key (of the whole zone, with
	// a static key) may be in flight at once: a slot is taken when the
	// request is admitted and freed when the handlers after rate_limit
	// return (the response written, the client gone, an error or a
	// panic). A request beyond the cap is refused with 503 Service
	// Unavailable and Retry-After. With a rate, a request must pass both,
	// and a rate unit taken for a request the cap refuses is given back;
	// without one (no max_events and window), the limit caps concurrency
	// alone. On the memory backend, counted per Caddy instance; on the
	// Redis backend, shared by every instance (see SlotTTL). Default: 0
	// (no cap); at most 2^30.
	Concurrency int64 `json:"concurrency,omitempty"`

	// Status is the HTTP status of a request this limit denies, from 400
	// to 599. 402 (Payment Required) or 403 (Forbidden) make the limit a
	// quota: its denials have their own reason and body (quota_exceeded),
	// so that a client told its month is spent does not retry like after
	// a 429. A scope without one takes its zone's. Default: 429 (Too Many
	// Requests).
	Status int `json:"status,omitempty"`

	// Tier picks, per request, which row of Tiers limits it: a placeholder
	// such as "{http.request.header.X-Plan}" or "{http.vars.plan}" (set by
	// an authentication handler that runs first). A value that is not the
	// name of a tier, is empty, or is given twice gets DefaultTier, so no
	// client can make a tier of its own. Required with Tiers.
	Tier string `json:"tier,omitempty"`

	// Tiers are the rates, bursts and concurrency caps of each tier, in
	// place of the limit's own max_events, window, burst and concurrency.
	// Each tier keeps its own state, named after the tier and its policy:
	// a key that moves to another tier starts there with a full quota, and
	// a tier whose policy a reload changes starts afresh. At most 64.
	Tiers []Tier `json:"tiers,omitempty"`

	// DefaultTier names the tier of requests whose Tier value is missing or
	// is not in Tiers. Required with Tiers.
	DefaultTier string `json:"default_tier,omitempty"`

	// Queue makes a request beyond the concurrency cap wait up to this long
	// for a slot, in order of arrival, before it is refused; a waiter whose
	// client leaves gives up its place. Default: 0 (refused at once); at
	// most 1h.
	Queue caddy.Duration `json:"queue,omitempty"`

	// QueueMax caps how many requests of a key may wait in the queue at
	// once (on the Redis backend, per Caddy instance); a request beyond
	// it is refused with 503 at once. Default: 0 (no cap); at most 2^30.
	QueueMax int64 `json:"queue_max,omitempty"`

	// SlotTTL is how long a concurrency slot held in Redis lasts unless
	// the instance holding it renews it. A live instance renews its slots
	// every third of it, so a long request keeps its slot; the slots of an
	// instance that dies mid-request are free again within SlotTTL. Redis
	// backend only. Default: 30s; from 1s to 1h.
	SlotTTL caddy.Duration `json:"slot_ttl,omitempty"`

	// Adaptive makes the limit follow the health of the upstream: its
	// concurrency, or the max_events of its rate, grows while the requests
	// it lets through are fast and succeed, and shrinks when they slow
	// down or fail (see Adaptive). On a limit with either a concurrency or
	// a rate, not both; a bucket rate's burst moves with its max_events,
	// in proportion. Default: unset, the limit is fixed.
	Adaptive *Adaptive `json:"adaptive,omitempty"`
}

// Normalize is one normalizer of a key: its name and its options.
type Normalize struct {
	// Name is trim, lower, email, phone, path or credentials (an
	// Authorization-style value: scheme in any case, any spaces before the
	// token).
	Name string `json:"name"`
	// Region is the default region of phone numbers written without a
	// country code, as an ISO 3166 code ("BD", "US"). Required for phone.
	Region string `json:"region,omitempty"`
	// Aliases, for email, applies provider rules: a +tag is dropped, and
	// for Gmail the dots of the local part too.
	Aliases bool `json:"aliases,omitempty"`
}

// Missing-key policies.
const (
	MissingShared = "shared"
	MissingSkip   = "skip"
	MissingDeny   = "deny"
)

// spoofable are request headers a client can set to anything; a key built
// from them directly lets one client pose as many.
var spoofable = []string{"x-forwarded-for", "x-real-ip", "forwarded", "true-client-ip", "cf-connecting-ip", "x-client-ip"}

// ownOnly names the options set on l that only a limit of its own reads:
// on a zone made only of scopes (no rate of its own) they would do nothing,
// since a scope inherits only fail (and, when it has no key of its own,
// the zone's key with its processing, which such a zone cannot have).
func (l *Limit) ownOnly() []string {
	return setOptions(
		option{l.Key != "", "key"}, option{l.Burst != 0, "burst"}, option{l.Algorithm != "", "algorithm"},
		option{l.MaxDelay != 0, "max_delay"}, option{l.Cost != nil, "cost"}, option{len(l.Normalize) > 0, "normalize"},
		option{l.Hash != "", "hash"}, option{l.IPv4Prefix != 0, "ipv4_prefix"}, option{l.IPv6Prefix != 0, "ipv6_prefix"},
		option{l.Missing != "", "missing"}, option{l.MaxKeys != 0, "max_keys"}, option{l.Lease != 0, "lease"},
		option{l.CountWhen != nil, "count_when"}, option{l.ResetWhen != nil, "reset_when"},
		option{l.Queue != 0, "queue"}, option{l.Lockout != nil, "lockout"}, option{l.Tier != "", "tier"}, option{l.DefaultTier != "", "default_tier"},
		option{l.ChargeWhen != nil, "charge_when"}, option{l.ReservationTTL != 0, "reservation_ttl"},
		option{l.Align != "", "align"}, option{l.Timezone != "", "timezone"},
		option{l.Settle != "", "settle"},
		option{l.Adaptive != nil, "adaptive"},
	)
}

// placeholderOnly names the options set on l that act on the values of the
// key's placeholders (which a key without placeholders has none of).
func (l *Limit) placeholderOnly() []string {
	return setOptions(
		option{len(l.Normalize) > 0, "normalize"}, option{l.Hash != "", "hash"}, option{l.IPv4Prefix != 0, "ipv4_prefix"},
		option{l.IPv6Prefix != 0, "ipv6_prefix"}, option{l.Missing != "", "missing"},
	)
}

// option is whether an option is set, and its name.
type option struct {
	set  bool
	name string
}

// setOptions names the options that are set, in order.
func setOptions(opts ...option) []string {
	var names []string
	for _, o := range opts {
		if o.set {
			names = append(names, o.name)
		}
	}
	return names
}

func ownOnlyError(unused []string) error {
	return fmt.Errorf("%s would do nothing on a zone without a rate of its own (only scopes): set max_events and window, or move %s into a scope",
		strings.Join(unused, ", "), itOrThem(unused))
}

func itOrThem(s []string) string {
	if len(s) == 1 {
		return "it"
	}
	return "them"
}

// constantCost is the cost of every request, or 0 when a placeholder
// decides it.
func (l *Limit) constantCost() int64 {
	switch {
	case l.Cost == nil:
		return 1
	case l.Cost.expr == "":
		return l.Cost.n
	}
	return 0
}

func (l *Limit) policy() algorithms.Policy {
	return algorithms.Policy{Limit: l.MaxEvents, Window: int64(l.Window), Burst: l.Burst, MaxDelay: int64(l.MaxDelay)}
}

// check validates what can be validated without a running config, so the
// Caddyfile adapter can name the line: it returns the canonical algorithm.
func (l *Limit) check() (string, error) {
	switch {
	case l.IPv4Prefix < 0 || l.IPv4Prefix > 32:
		return "", optionErrorf("ipv4_prefix", "ipv4_prefix must be between 0 and 32, got %d", l.IPv4Prefix)
	case l.IPv6Prefix < 0 || l.IPv6Prefix > 128:
		return "", optionErrorf("ipv6_prefix", "ipv6_prefix must be between 0 and 128, got %d", l.IPv6Prefix)
	case l.MaxKeys < 0:
		return "", optionErrorf("max_keys", "max_keys must be at least 1, got %d", l.MaxKeys)
	case l.MaxKeys > MaxKeysLimit:
		return "", optionErrorf("max_keys", "max_keys must be at most %d, got %d", MaxKeysLimit, l.MaxKeys)
	case l.Burst < 0:
		return "", optionErrorf("burst", "burst must be at least 1, got %d", l.Burst)
	case l.MaxDelay < 0:
		return "", optionErrorf("max_delay", "max_delay must be positive, got %s", algorithms.FormatSpan(int64(l.MaxDelay)))
	case !validFail(l.Fail):
		return "", optionErrorf("fail", "fail must be open, closed or local, got %q", l.Fail)
	}
	switch l.Missing {
	case "", MissingShared, MissingSkip, MissingDeny:
	default:
		return "", optionErrorf("missing", "missing must be shared, skip or deny, got %q", l.Missing)
	}
	if err := l.checkConc(); err != nil {
		return "", err
	}
	alg := ""
	if !l.concOnly() {
		var err error
		if alg, err = algorithms.Check(l.Algorithm, l.policy()); err != nil {
			return "", err
		}
	}
	if err := l.checkOutcome(); err != nil {
		return "", err
	}
	if err := l.checkBudget(alg); err != nil {
		return "", err
	}
	if err := l.checkSettle(alg); err != nil {
		return "", err
	}
	if err := l.checkLockout(); err != nil {
		return "", err
	}
	if l.Cost != nil {
		if err := l.Cost.validate(); err != nil {
			return "", err
		}
		most := algorithms.MaxCost(alg, l.policy())
		if l.Cost.expr == "" && l.Cost.n > most {
			return "", optionErrorf("cost", "cost %d can never pass: the limit holds at most %d units (raise %s)", l.Cost.n, most, burstOrMax(alg, l.MaxDelay))
		}
		if least := l.Cost.least(); least > most {
			return "", optionErrorf("cost", "cost %q can never pass: its numbers alone add up to %d, and the limit holds at most %d units (raise %s)", l.Cost.expr, least, most, burstOrMax(alg, l.MaxDelay))
		}
	}
	if err := l.checkCostMin(alg); err != nil {
		return "", err
	}
	for i, n := range l.Normalize {
		if _, err := keys.NewNormalizer(n.Name, n.Region, n.Aliases); err != nil {
			return "", optionErrorf("normalize", "normalize[%d]: %v", i, err)
		}
	}
	if l.Hash != "" && !strings.Contains(l.Hash, "{") && len(l.Hash) < minSecret {
		return "", optionErrorf("hash", "hash: the secret must be at least %d bytes, got %d", minSecret, len(l.Hash))
	}
	tmpl, err := keys.ParseTemplate(l.Key)
	if err == nil {
		err = keys.CheckTemplate(tmpl)
	}
	if err != nil {
		return "", optionErrorf("key", "key: %v", err)
	}
	if unused := l.placeholderOnly(); len(unused) > 0 && len(tmpl.Placeholders()) == 0 {
		return "", optionErrorf(unused[0], "%s would do nothing: the key %q has no placeholder, so it is the same for every request (use a placeholder such as {http.vars.client_ip}, or remove %s)",
			strings.Join(unused, ", "), l.Key, itOrThem(unused))
	}
	if err := l.checkLease(alg); err != nil {
		return "", err
	}
	if err := l.checkAdaptive(alg); err != nil {
		return "", err
	}
	return alg, nil
}

// minSecret is the shortest HMAC secret accepted, in bytes.
const minSecret = 16

// MaxKeysLimit is the largest max_keys: 2^30 keys, tens of gigabytes of
// state, which also keeps a key count within a 32-bit int.
const MaxKeysLimit = 1 << 30

func burstOrMax(alg string, maxDelay caddy.Duration) string {
	switch {
	case maxDelay > 0:
		return "max_delay"
	case algorithms.UsesBurst(alg):
		return "burst"
	}
	return "max_events"
}

func validScopeName(s string) bool { return s != "" && !strings.ContainsAny(s, "/{}") }

// DefaultNearLimit is the fraction of a limit used from which an allowed
// request counts as near the limit, when a zone does not set near_limit.
const DefaultNearLimit = 0.8

// checkNearLimit refuses a near_limit that is not a fraction strictly
// between 0 and 1 (0 is unset: the default).
func checkNearLimit(f float64) error {
	if f == 0 || (f > 0 && f < 1) {
		return nil
	}
	return fmt.Errorf("near_limit must be a fraction of the limit between 0 and 1, such as 0.8, got %v", f)
}

// nearLeft is the fraction of a limit left under which an allowed request
// is near the limit. It is rounded to nine digits so that a ratio written
// in decimals compares as written: 1 - 0.7 is 0.30000000000000004 in
// floats, which would count a key left with exactly 30%.
func (z *Zone) nearLeft() float64 {
	f := cmp.Or(z.NearLimit, DefaultNearLimit)
	return math.Round((1-f)*1e9) / 1e9
}
