package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// MaxKeyLen is the longest key kept as it is; a longer one is replaced by
// its SHA-256, so a client cannot make keys (in logs, placeholders or a
// shared store) as large as it likes.
const MaxKeyLen = 256

// Keyer builds one scope's key from a request.
type Keyer struct {
	tmpl   Template
	v4, v6 int
	norms  []Normalizer
	secret []byte
	body   bool
	// errs[i] are the errors of placeholder part i when it is empty or
	// given twice, made once: a flood of requests without a key must not
	// allocate an error each.
	errs []partErrors
}

type partErrors struct{ absent, ambiguous error }

// Options are what a Keyer does to the key template's values.
type Options struct {
	// IPv4Prefix and IPv6Prefix mask placeholder values that are IP
	// addresses to their network (0: the address itself).
	IPv4Prefix, IPv6Prefix int
	// Normalizers run, in order, on every placeholder value.
	Normalizers []Normalizer
	// Secret, when set, replaces the key by its HMAC-SHA256 under it.
	Secret []byte
}

// NewKeyer prepares template with opts.
func NewKeyer(template string, opts Options) (*Keyer, error) {
	t, err := ParseTemplate(template)
	if err != nil {
		return nil, err
	}
	k := &Keyer{tmpl: t, v4: opts.IPv4Prefix, v6: opts.IPv6Prefix, norms: opts.Normalizers, secret: opts.Secret, body: t.NeedsBody()}
	k.errs = make([]partErrors, len(t.parts))
	for i, p := range t.parts {
		if p.placeholder {
			k.errs[i] = partErrors{absent: missingError(p.text, errEmpty), ambiguous: missingError(p.text, ErrAmbiguous)}
		}
	}
	return k, nil
}

// NeedsBody reports whether the key reads fields of the request body.
func (k *Keyer) NeedsBody() bool { return k.body }

// Template returns the key template.
func (k *Keyer) Template() Template { return k.tmpl }

// ErrMissing wraps the reason a key could not be built: a placeholder had
// no value (ErrAbsent), the request gave it twice (ErrAmbiguous), the body
// could not be read (ErrUnreadable), or a normalizer refused the value.
var ErrMissing = errors.New("key is missing")

// Key builds the key for r. Each placeholder's value is looked up (body
// fields in body, which may be nil when NeedsBody is false), canonicalized
// if it is an IP address (and masked to the configured prefix), and
// normalized. When a value is empty or invalid, Key returns the key with
// that value empty (what mholt/caddy-ratelimit would use) and an error
// wrapping ErrMissing, and the zone's missing-key policy decides. The error
// wraps ErrAbsent only when every value missing is absent, so that one
// absent part cannot make a key skippable whose other part was unreadable.
func (k *Keyer) Key(r *http.Request, repl *caddy.Replacer, body *Body) (string, error) {
	var sb strings.Builder
	var key string
	var missing error
	for i, p := range k.tmpl.parts {
		v := p.text
		if p.placeholder {
			var err error
			v, err = k.value(r, repl, body, p.text)
			if err != nil && (missing == nil || errors.Is(missing, ErrAbsent) && !errors.Is(err, ErrAbsent)) {
				missing = k.missingError(i, err)
			}
		}
		switch i {
		case 0:
			// A key of one part (by ip, by header…) is its value, not a
			// copy of it.
			key = v
		case 1:
			sb.WriteString(key)
			fallthrough
		default:
			sb.WriteString(v)
		}
	}
	if len(k.tmpl.parts) > 1 {
		key = sb.String()
	}
	return k.final(key), missing
}

// final is key as stored: its HMAC under the secret, or its SHA-256 when
// it is too long.
func (k *Keyer) final(key string) string {
	switch {
	case k.secret != nil:
		mac := hmac.New(sha256.New, k.secret)
		mac.Write([]byte(key))
		key = "hmac:" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	case len(key) > MaxKeyLen || strings.HasPrefix(key, "sha256:"):
		// A short key spelled like a long key's digest is hashed too, so a
		// client cannot name the bucket of a key it could not send.
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return key
}

// missingError is the error of a key whose placeholder part i could not be
// read for err.
func (k *Keyer) missingError(i int, err error) error {
	switch err {
	case errEmpty:
		return k.errs[i].absent
	case ErrAmbiguous:
		return k.errs[i].ambiguous
	}
	return missingError(k.tmpl.parts[i].text, err)
}

func missingError(name string, err error) error {
	return fmt.Errorf("%w: {%s}: %w", ErrMissing, name, err)
}

// errEmpty is the error of a placeholder whose value is empty.
var errEmpty = fmt.Errorf("%w: empty", ErrAbsent)

func (k *Keyer) value(r *http.Request, repl *caddy.Replacer, body *Body, name string) (string, error) {
	v, err := lookup(r, repl, body, name)
	if err != nil {
		return "", err
	}
	return k.transform(v)
}

// transform is what the keyer does to one placeholder value: IP addresses
// canonical and masked, then the normalizers.
func (k *Keyer) transform(v string) (string, error) {
	if v == "" {
		return "", errEmpty
	}
	if ip, ok := canonicalIP(v, k.v4, k.v6); ok {
		v = ip
	}
	for _, n := range k.norms {
		var err error
		if v, err = n(v); err != nil {
			return "", err
		}
	}
	if v == "" {
		// A value that normalizes to nothing was still sent: not absent.
		return "", errors.New("empty after normalizing")
	}
	return v, nil
}

// lookup returns the value of placeholder name: a body field from body, a
// query parameter from the raw query, or what repl holds, unless the
// request gives it more than once. An absent
// body field is an error wrapping ErrAbsent; any other placeholder is
// empty when absent.
func lookup(r *http.Request, repl *caddy.Replacer, body *Body, name string) (string, error) {
	if name == BodySize {
		if body == nil {
			return "", fmt.Errorf("%w: body not read", ErrUnreadable)
		}
		return body.Size()
	}
	if _, _, ok := bodyPlaceholder(name); ok {
		if body == nil {
			return "", fmt.Errorf("%w: body not read", ErrUnreadable)
		}
		return body.Field(name)
	}
	if param, ok := strings.CutPrefix(name, queryPrefix); ok && r != nil {
		v, ambiguous := queryValue(r.URL.RawQuery, param)
		if ambiguous {
			return "", ErrAmbiguous
		}
		return v, nil
	}
	if r != nil && repeated(r, name) {
		return "", ErrAmbiguous
	}
	if v, ok := strings.CutPrefix(name, varsPrefix); ok && r != nil {
		// What Caddy's provider answers, without walking the replacer's
		// providers (about a fifth of deciding a "by ip" request).
		if vars, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
			return caddy.ToString(vars[v]), nil
		}
	}
	v, _ := repl.GetString(name)
	if strings.HasPrefix(name, cookiePrefix) {
		v = cookieValue(v)
	}
	return v, nil
}

// cookieValue is a cookie's value as applications read it: Express
// (cookie-parser) and PHP percent-decode it, so "vic%74im" is "victim" to
// them, and PHP reads "+" as a space. A value that does not decode to
// UTF-8 is kept as sent, as Express keeps it; "+" and a space are one
// character either way, which only merges values that PHP merges.
func cookieValue(v string) string {
	if !strings.ContainsAny(v, "%+") {
		return v
	}
	if d, err := url.PathUnescape(v); err == nil && utf8.ValidString(d) {
		v = d
	}
	return strings.ReplaceAll(v, "+", " ")
}

// Placeholders of request fields a client can repeat.
const (
	headerPrefix = "http.request.header."
	queryPrefix  = "http.request.uri.query."
	varsPrefix   = "http.vars."
	cookiePrefix = "http.request.cookie."
)

// repeated reports whether r gives the header or cookie behind placeholder
// name more than once (queryValue tells it of a query parameter). Caddy
// would join the headers ("a,b") and pick one of the cookies, while the
// application might read any one copy: a limit keyed on it could be
// stepped around.
func repeated(r *http.Request, name string) bool {
	switch {
	case strings.HasPrefix(name, headerPrefix):
		return len(r.Header.Values(strings.TrimPrefix(name, headerPrefix))) > 1
	case strings.HasPrefix(name, cookiePrefix):
		return cookieAmbiguous(r.Cookies(), strings.TrimPrefix(name, cookiePrefix))
	}
	return false
}

// cookieAmbiguous reports whether the cookie name is given more than once,
// or once in a spelling Caddy does not read. PHP percent-decodes cookie
// names and reads " " and "." in them as "_" (as in form fields), and
// ASP.NET ignores their case: "sess%69on=victim; session=junk" is the
// cookie session=victim to PHP (the first copy wins) and junk to Caddy.
func cookieAmbiguous(cookies []*http.Cookie, name string) bool {
	seen, exact := 0, false
	for _, c := range cookies {
		if sameFormName(queryName(c.Name), name) {
			seen++
			exact = exact || c.Name == name
		}
	}
	return seen > 1 || seen == 1 && !exact
}

// queryValue returns the value of parameter name in a raw query, as Go's
// URL.Query (and so Caddy's placeholder) reads it, unless the query gives
// it in a way that Caddy and the application may read differently
// (ambiguous). One pass finds both without allocating (unless the value is
// escaped), where Caddy's placeholder parses the whole query into a map
// each time it is read. Go reads no parameter at all of a query of more
// than 10,000 (urlmaxqueryparams), which the application may still read:
// the value is taken all the same.
//
// Caddy and the application may read a parameter differently. Caddy reads the
// query with Go's URL.Query, which splits pairs on "&" only and drops every
// pair that holds a ";" or a bad escape, while Python's urllib.parse before
// 3.9.2, Rack 2 (Rails before 8.1) and other parsers still deployed split
// on ";" as well, ASP.NET compares names without regard to case, PHP drops
// leading spaces from names, and most keep a value with a bad escape. So
// the query is split on both, each name is percent-decoded ("+" is a space,
// a bad escape stays as it is) and compared without leading spaces and
// ignoring case, and the parameter is ambiguous when it occurs more than
// once, or once where Go does not read it: in "?user=r1&user=victim;x=1"
// Caddy's placeholder is "r1" while a ";"-splitting application may read
// "victim", and in "?user=victim;x=1" the placeholder is empty.
func queryValue(raw, name string) (v string, ambiguous bool) {
	seen, goReads := 0, false
	for raw != "" {
		var seg string
		seg, raw, _ = strings.Cut(raw, "&")
		semicolon := strings.Contains(seg, ";")
		for seg != "" {
			var pair string
			pair, seg, _ = strings.Cut(seg, ";")
			key, value, _ := strings.Cut(pair, "=")
			if decoded := strings.TrimLeft(queryName(key), " "); !strings.EqualFold(decoded, name) {
				if arrayName(decoded, name) {
					return "", true
				}
				continue
			}
			if seen++; seen > 1 {
				return "", true
			}
			if !semicolon {
				k, kerr := url.QueryUnescape(key)
				val, verr := url.QueryUnescape(value)
				goReads = kerr == nil && verr == nil && k == name
				v = val
			}
		}
	}
	if seen == 1 && !goReads {
		return "", true
	}
	return v, false
}

// queryName decodes a query parameter's name leniently: "+" is a space,
// valid %XX escapes are decoded, and anything else is kept.
func queryName(key string) string {
	if !strings.ContainsAny(key, "%+") {
		return key
	}
	return unescapePath(strings.ReplaceAll(key, "+", " "))
}
