package keys

import (
	"fmt"
	"strings"
)

// A placeholder that no module answers expands to nothing, so a key with a
// misspelt one ({http.request.heder.X-API-Key}) is the same for every
// request and puts every client in one quota, silently. CheckPlaceholder
// holds the names of the namespaces Caddy's standard modules and Sluice
// own to what they define, and any name to a known one it is a slip from.

// exactNames are the placeholders that take no suffix.
var exactNames = []string{
	"http.request.body", "http.request.body_base64",
	"http.request.duration", "http.request.duration_ms",
	"http.request.host", "http.request.hostport", "http.request.port",
	"http.request.local", "http.request.local.host", "http.request.local.port",
	"http.request.method", "http.request.orig_method",
	"http.request.orig_uri", "http.request.orig_uri.path", "http.request.orig_uri.path.dir",
	"http.request.orig_uri.path.file", "http.request.orig_uri.path.file_escaped",
	"http.request.orig_uri.query", "http.request.orig_uri.prefixed_query",
	"http.request.proto", "http.request.proto_name",
	"http.request.remote", "http.request.remote.host", "http.request.remote.port",
	"http.request.scheme",
	"http.request.uri", "http.request.uri_escaped",
	"http.request.uri.path", "http.request.uri.path_escaped", "http.request.uri.path.dir",
	"http.request.uri.path.file", "http.request.uri.path.file.base", "http.request.uri.path.file.ext",
	"http.request.uri.query", "http.request.uri.query_escaped", "http.request.uri.prefixed_query",
	"http.request.uuid",
	"http.request.tls.cipher_suite", "http.request.tls.proto", "http.request.tls.proto_mutual",
	"http.request.tls.resumed", "http.request.tls.server_name", "http.request.tls.version", "http.request.tls.ech",
	"http.request.tls.client.fingerprint", "http.request.tls.client.public_key",
	"http.request.tls.client.public_key_sha256", "http.request.tls.client.issuer",
	"http.request.tls.client.serial", "http.request.tls.client.subject",
	"http.request.tls.client.certificate_pem", "http.request.tls.client.certificate_der_base64",
	"http.response.status", "http.response.size", "http.response.duration", "http.response.duration_ms",
	"http.shutting_down", "http.time_until_shutdown",
	"http.error", "http.error.id", "http.error.message", "http.error.status_code",
	"http.error.status_text", "http.error.trace",
	"http.intercept.status_code",
	"http.matchers.file.absolute", "http.matchers.file.relative", "http.matchers.file.remainder",
	"http.matchers.file.type",
	"system.hostname", "system.slash", "system.os", "system.arch", "system.wd",
	"time.now", "time.now.http", "time.now.rfc3339", "time.now.common_log", "time.now.year",
	"time.now.unix", "time.now.unix_ms",
	BodySize,
}

// prefixNames are the placeholders that take a suffix of the user's choice
// (a header's name, a variable's, a JSON path…), written here with the
// suffix as "*". A "#" suffix is a number (a host label, a path segment).
var prefixNames = []string{
	"http.request.header.*", "http.request.cookie.*", "http.request.uri.query.*",
	"http.request.host.labels.#", "http.request.uri.path.#", "http.request.orig_uri.path.#",
	"http.request.remote.host/#",
	"http.request.tls.client.san.*",
	BodyJSONPrefix + "*", BodyFormPrefix + "*", BodyFieldPrefix + "*",
	"http.response.header.*", "http.response.trailer.*",
	"http.vars.*", "http.auth.*", "http.reverse_proxy.*", "http.intercept.header.*",
	"http.regexp.*", "http.matchers.*", "http.rate_limit.*",
	"env.*", "file.*",
}

// A Caddyfile writes placeholders in short forms that its adapter expands
// ({client_ip} is {http.vars.client_ip}); a JSON config holds the long
// form, and a short one there is never expanded.
var shorthands = map[string]string{
	"client_ip": "http.vars.client_ip", "remote": "http.request.remote", "remote_host": "http.request.remote.host",
	"remote_port": "http.request.remote.port", "host": "http.request.host", "hostport": "http.request.hostport",
	"port": "http.request.port", "method": "http.request.method", "scheme": "http.request.scheme",
	"uri": "http.request.uri", "path": "http.request.uri.path", "query": "http.request.uri.query",
	"dir": "http.request.uri.path.dir", "file": "http.request.uri.path.file",
	"header.*": "http.request.header.*", "cookie.*": "http.request.cookie.*", "query.*": "http.request.uri.query.*",
	"labels.*": "http.request.host.labels.*", "vars.*": "http.vars.*", "re.*": "http.regexp.*",
	"tls_client_subject": "http.request.tls.client.subject",
}

// CheckPlaceholder returns nil when name (without its braces) is a
// placeholder that Caddy's standard modules or Sluice define, else an
// error that names it and the known placeholder it most likely means.
func CheckPlaceholder(name string) error {
	if name == "" {
		return fmt.Errorf("empty placeholder {}")
	}
	if strings.ContainsAny(name, "{}") {
		return fmt.Errorf("placeholder {%s}: a brace inside a placeholder", name)
	}
	if known(name) {
		return nil
	}
	for _, p := range prefixNames {
		if name == p[:len(p)-1] {
			return fmt.Errorf("placeholder {%s} names no field after %s", name, name)
		}
	}
	if long, ok := shorthandOf(name); ok {
		return fmt.Errorf("unknown placeholder {%s}: %s is the Caddyfile's short form, which a JSON config does not expand; write {%s}", name, "{"+name+"}", long)
	}
	s := closest(name)
	switch {
	case s != "":
		return fmt.Errorf("unknown placeholder {%s}: did you mean {%s}?", name, s)
	case Owned(name):
		return fmt.Errorf("unknown placeholder {%s}: no Caddy module or Sluice sets it, so it would be empty for every request", name)
	}
	// Another module's ({geoip2.country_code}) or a name an earlier
	// handler sets (the destination of a map): known only once a request
	// runs, where an empty one is warned about.
	return nil
}

// ownedNamespaces are the placeholder namespaces that Caddy's standard
// modules and Sluice define in full: a name in one of them that none of
// them sets is a mistake. Other names may belong to another module.
var ownedNamespaces = []string{"http.", "env.", "system.", "time.", "file."}

// Owned reports whether name is in a namespace that Caddy's standard
// modules and Sluice define in full.
func Owned(name string) bool {
	for _, ns := range ownedNamespaces {
		if strings.HasPrefix(name, ns) {
			return true
		}
	}
	return false
}

func known(name string) bool {
	for _, n := range exactNames {
		if name == n {
			return true
		}
	}
	for _, p := range prefixNames {
		stem, kind := p[:len(p)-1], p[len(p)-1]
		rest, ok := strings.CutPrefix(name, stem)
		if !ok || rest == "" {
			continue
		}
		if kind == '*' || allDigits(rest) {
			return true
		}
	}
	return false
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// shorthandOf is the long form of a Caddyfile short form.
func shorthandOf(name string) (string, bool) {
	if long, ok := shorthands[name]; ok {
		return long, true
	}
	if i := strings.IndexByte(name, '.'); i > 0 {
		if long, ok := shorthands[name[:i]+".*"]; ok {
			return strings.TrimSuffix(long, "*") + name[i+1:], true
		}
	}
	return "", false
}

// closest is the known placeholder nearest to name by edit distance, with
// the user's own suffix kept where the known one takes a suffix: a
// misspelt namespace ("http.request.heder.X-Key") is suggested with its
// field ("http.request.header.X-Key"). "" when nothing is near: a
// suggestion more than a fifth of the compared part away (at least 2
// edits) is a guess.
func closest(name string) string {
	best, bestDist := "", -1
	consider := func(candidate string, dist, compared int) {
		if dist > max(2, compared/5) {
			return
		}
		if bestDist < 0 || dist < bestDist {
			best, bestDist = candidate, dist
		}
	}
	for _, n := range exactNames {
		consider(n, distance(name, n), len(n))
	}
	for _, p := range prefixNames {
		stem := p[:len(p)-1]
		// Try every split of name into a namespace and a suffix at a
		// dot (or a slash, for the remote address's network).
		for i := 0; i < len(name); i++ {
			if name[i] != '.' && name[i] != '/' {
				continue
			}
			head, rest := name[:i+1], name[i+1:]
			if rest == "" || p[len(p)-1] == '#' && !allDigits(rest) {
				continue
			}
			consider(stem+rest, distance(head, stem), len(stem))
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// CheckTemplate checks every placeholder of t, and refuses a { that no }
// closes: Caddy reads it as text, so a key missing its closing brace
// would be the same literal text for every request.
func CheckTemplate(t Template) error {
	if i := unclosed(t.raw); i >= 0 {
		return fmt.Errorf("%q: the { at byte %d has no closing }, so it would be read as text, the same for every request", t.raw, i+1)
	}
	for _, p := range t.parts {
		if !p.placeholder {
			continue
		}
		if err := CheckPlaceholder(p.text); err != nil {
			return err
		}
	}
	return nil
}

// unclosed is the position of the first unescaped { that no } closes, or
// -1.
func unclosed(s string) int {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}'):
			i++
		case s[i] == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return i
			}
			i += end + 1
		}
	}
	return -1
}
