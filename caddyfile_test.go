package sluice

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of testdata/adapt from the current adapter")

const adaptSeparator = "\n----------\n"

// Each testdata/adapt file is a Caddyfile, a line of dashes, and the JSON
// `caddy adapt` must produce for it. The mholt_* files are configs written
// for mholt/caddy-ratelimit (its README and its tests), which must adapt
// unchanged.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, _ := strings.Cut(string(data), adaptSeparator)
			if *update {
				out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
				if err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				if err := json.Indent(&buf, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				expected = buf.String()
				if err := os.WriteFile(file, []byte(caddyfile+adaptSeparator+expected+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", strings.TrimSuffix(expected, "\n")) {
				t.Errorf("adapted JSON differs from %s (diff above; -update rewrites it)", file)
			}
		})
	}
}

func TestCaddyfileErrors(t *testing.T) {
	// line is the Caddyfile line the error must name; the block starts on
	// line 2, under the site address.
	tests := []struct {
		name, block, want string
		line              int
	}{
		{"argument on directive", "rate_limit foo bar {\n}", "wrong argument count", 2},
		{"unknown option", "rate_limit {\n\tburst 5\n}", `unrecognized subdirective "burst"`, 3},
		{"unknown zone option", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tlimit 5\n\t}\n}", `zone "a": unrecognized subdirective "limit"`, 5},
		{"duplicate zone", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t}\n\tzone a {\n\t\trate 2/s\n\t}\n}", `zone "a" already defined`, 6},
		{"misspelt key placeholder", "rate_limit {\n\tzone a {\n\t\tkey {http.request.heder.X-API-Key}\n\t\trate 1/s\n\t}\n}", `unknown placeholder {http.request.heder.X-API-Key}: did you mean {http.request.header.X-API-Key}?`, 4},
		{"key missing its closing brace", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tkey {http.request.header.X-API-Key\n\t}\n}", `has no closing }`, 5},
		{"misspelt cost placeholder", "rate_limit {\n\tzone a {\n\t\trate 100/s\n\t\tcost {http.request.header.X-Cost}+{http.request.body.jsn.tokens}\n\t}\n}", `did you mean {http.request.body.json.tokens}?`, 5},
		{"misspelt tier placeholder", "rate_limit {\n\tzone a {\n\t\tkey static\n\t\ttier {http.request.haeder.X-Plan}\n\t\ttiers {\n\t\t\tfree 10/1m\n\t\t\tdefault free\n\t\t}\n\t}\n}", `did you mean {http.request.header.X-Plan}?`, 5},
		{"misspelt settle placeholder", "rate_limit {\n\tzone a {\n\t\trate 100/s\n\t\tsettle {http.response.heades.X-Used}\n\t}\n}", `did you mean {http.response.header.X-Used}?`, 5},
		{"rate window not a duration", "rate_limit {\n\tzone a {\n\t\trate 100/minute\n\t}\n}", `"minute" is not a duration: write a number and a unit`, 4},
		{"zone without name", "rate_limit {\n\tzone {\n\t}\n}", "wrong argument count", 3},
		{"zone without rate", "rate_limit {\n\tzone a {\n\t\tkey x\n\t}\n}", "requires both a window and maximum events", 3},
		{"backend without name", "rate_limit {\n\tbackend\n}", "wrong argument count", 3},
		{"unknown backend", "rate_limit {\n\tbackend etcd\n}", "getting module named 'http.rate_limit.backends.etcd'", 3},
		{"memory backend with options", "rate_limit {\n\tbackend memory {\n\t\tsize 5\n\t}\n}", "backend memory takes no options", 4},
		{"events without window", "rate_limit {\n\tzone a {\n\t\tevents 5\n\t}\n}", "requires both a window and maximum events", 3},
		{"rate and events", "rate_limit {\n\tzone a {\n\t\trate 5/m\n\t\tevents 5\n\t}\n}", "use either rate or events and window", 5},
		{"repeated key", "rate_limit {\n\tzone a {\n\t\tkey x\n\t\tkey y\n\t\trate 1/s\n\t}\n}", `zone "a": key already specified`, 5},
		{"repeated window", "rate_limit {\n\tzone a {\n\t\twindow 1m\n\t\twindow 2m\n\t\tevents 1\n\t}\n}", "window already specified", 5},
		{"repeated events", "rate_limit {\n\tzone a {\n\t\tevents 1\n\t\tevents 1\n\t\twindow 1m\n\t}\n}", "events already specified", 5},
		{"repeated jitter", "rate_limit {\n\tjitter 0.1\n\tjitter 0.2\n}", "jitter already specified", 4},
		{"bad events", "rate_limit {\n\tzone a {\n\t\tevents ten\n\t\twindow 1m\n\t}\n}", `events must be a whole number ≥ 1, got "ten"`, 4},
		{"zero events", "rate_limit {\n\tzone a {\n\t\tevents 0\n\t\twindow 1m\n\t}\n}", `events must be a whole number ≥ 1, got "0"`, 4},
		{"bad window", "rate_limit {\n\tzone a {\n\t\tevents 1\n\t\twindow soon\n\t}\n}", `invalid window "soon"`, 5},
		{"negative window", "rate_limit {\n\tzone a {\n\t\tevents 1\n\t\twindow -1m\n\t}\n}", "window must be positive", 5},
		{"bad rate", "rate_limit {\n\tzone a {\n\t\trate 100\n\t}\n}", `invalid rate "100"`, 4},
		{"bad rate unit", "rate_limit {\n\tzone a {\n\t\trate 100/fortnight\n\t}\n}", `"fortnight" is not a duration`, 4},
		{"zero burst", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tburst 0\n\t}\n}", `burst must be a whole number ≥ 1, got "0"`, 5},
		{"bad cost", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tcost lots\n\t}\n}", `cost must be a whole number or a placeholder, got "lots"`, 5},
		{"cost of braces only", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tcost }{\n\t}\n}", `cost must be a whole number or a placeholder such as {http.request.header.X-Cost}, got "}{"`, 5},
		{"cost of an unclosed placeholder", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tcost {http.request.header.X-C\n\t}\n}", `cost must be a whole number or a placeholder such as`, 5},
		{"negative cost", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tcost -1\n\t}\n}", "must be at least 0", 5},
		{"settle of a number", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tsettle 1800\n\t}\n}", "settle must be one placeholder", 5},
		{"settle of a queue", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\talgorithm leaky_bucket\n\t\tmax_delay 1s\n\t\tsettle {http.response.header.X-Tokens-Used}\n\t}\n}", "settle cannot be used with max_delay", 7},
		{"cost sum with a bad part", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tcost {http.request.header.A}+lots\n\t}\n}", "cost must be a whole number or a placeholder", 5},
		{"prefix out of range", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tipv4_prefix 33\n\t}\n}", "ipv4_prefix must be a whole number from 0 to 32", 5},
		{"v6 prefix out of range", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tipv6_prefix 129\n\t}\n}", "ipv6_prefix must be a whole number from 0 to 128", 5},
		{"two keys on a line", "rate_limit {\n\tzone a {\n\t\tkey x y\n\t\trate 1/s\n\t}\n}", `key takes one value, got another: "y"`, 4},
		{"bad jitter", "rate_limit {\n\tjitter lots\n}", `invalid jitter "lots"`, 3},
		{"negative jitter", "rate_limit {\n\tjitter -0.5\n}", `invalid jitter "-0.5"`, 3},
		{"log_key with value", "rate_limit {\n\tlog_key yes\n}", "wrong argument count", 3},
		{"bad distributed option", "rate_limit {\n\tdistributed {\n\t\tevery 5s\n\t}\n}", `distributed: unrecognized subdirective "every"`, 4},
		{"bad fail", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tfail maybe\n\t}\n}", `zone "a": fail must be open, closed or local, got "maybe"`, 5},
		{"bad max_delay", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tmax_delay soon\n\t}\n}", `invalid max_delay "soon"`, 5},
		{"unknown by", "rate_limit {\n\tzone a {\n\t\tby magic\n\t\trate 1/s\n\t}\n}", `by "magic": want ip, subnet`, 4},
		{"by header without name", "rate_limit {\n\tzone a {\n\t\tby header\n\t\trate 1/s\n\t}\n}", "by header takes 1 argument(s), got 0", 4},
		{"by body without field", "rate_limit {\n\tzone a {\n\t\tby body\n\t\trate 1/s\n\t}\n}", "by body takes 1 argument(s), got 0", 4},
		{"by body with braces", "rate_limit {\n\tzone a {\n\t\tby body a}b\n\t\trate 1/s\n\t}\n}", `by body "a}b": a name cannot hold braces`, 4},
		{"by body empty segment", "rate_limit {\n\tzone a {\n\t\tby body user..id\n\t\trate 1/s\n\t}\n}", `the JSON path "user..id" has an empty segment`, 4},
		{"by and key", "rate_limit {\n\tzone a {\n\t\tby ip\n\t\tkey x\n\t\trate 1/s\n\t}\n}", "use either key or by, not both", 5},
		{"unknown normalizer", "rate_limit {\n\tzone a {\n\t\tnormalize soundex\n\t\trate 1/s\n\t}\n}", `unknown normalizer "soundex"`, 4},
		{"phone without region", "rate_limit {\n\tzone a {\n\t\tnormalize phone\n\t\trate 1/s\n\t}\n}", "needs a default region", 4},
		{"phone bad region", "rate_limit {\n\tzone a {\n\t\tnormalize phone ZZ\n\t\trate 1/s\n\t}\n}", `unknown region "ZZ"`, 4},
		{"email bad option", "rate_limit {\n\tzone a {\n\t\tnormalize email gmail\n\t\trate 1/s\n\t}\n}", `normalize email: unexpected "gmail"`, 4},
		{"bad missing", "rate_limit {\n\tzone a {\n\t\tmissing ignore\n\t\trate 1/s\n\t}\n}", `missing must be shared, skip or deny, got "ignore"`, 4},
		{"duplicate scope", "rate_limit {\n\tzone a {\n\t\tscope ip {\n\t\t\trate 1/s\n\t\t}\n\t\tscope ip {\n\t\t\trate 1/s\n\t\t}\n\t}\n}", `zone "a": scope "ip" already defined`, 7},
		{"scope without rate", "rate_limit {\n\tzone a {\n\t\tscope ip {\n\t\t\tby ip\n\t\t}\n\t}\n}", `zone "a" scope "ip": a rate limit zone requires both a window and maximum events`, 4},
		{"unknown scope option", "rate_limit {\n\tzone a {\n\t\tscope ip {\n\t\t\tshadow\n\t\t}\n\t}\n}", `zone "a" scope "ip": unrecognized subdirective "shadow"`, 5},
		{"bad allow", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tallow 10.0.0.0/33\n\t}\n}", `zone "a": allow:`, 5},
		{"bad deny", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tdeny nowhere\n\t}\n}", `zone "a": deny:`, 5},
		{"bad body_limit", "rate_limit {\n\tbody_limit lots\n}", `invalid body_limit "lots"`, 3},
		{"unknown algorithm", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\talgorithm fastest\n\t}\n}", `zone "a": unknown algorithm "fastest"`, 5},
		{"burst on sliding window", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tburst 5\n\t}\n}", `zone "a": burst does not apply to algorithm sliding_window`, 5},
		{"max_delay without leaky", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tmax_delay 1s\n\t}\n}", `zone "a": max_delay applies only to algorithm leaky_bucket`, 5},
		{"cost above the limit", "rate_limit {\n\tzone a {\n\t\trate 5/s\n\t\tcost 6\n\t}\n}", `zone "a": cost 6 can never pass`, 5},
		{"bad scope name", "rate_limit {\n\tzone a {\n\t\tscope x/y {\n\t\t\trate 1/s\n\t\t}\n\t}\n}", `zone "a": scope "x/y": a scope name must be non-empty`, 4},
		{"short literal secret", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\thash hunter2\n\t}\n}", `zone "a": hash: the secret must be at least 16 bytes, got 7`, 5},
		{"scope rate in zone of scopes", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 1/s\n\t\t\tcost 9\n\t\t}\n\t}\n}", `zone "a" scope "s": cost 9 can never pass`, 6},
		{"negative sweep_interval", "rate_limit {\n\tsweep_interval -1s\n}", `invalid sweep_interval "-1s": must be positive`, 3},
		{"sweep_interval 0 then another", "rate_limit {\n\tsweep_interval 0\n\tsweep_interval 5s\n}", "sweep_interval already specified", 4},
		{"body_limit of 1GiB", "rate_limit {\n\tbody_limit 1GiB\n}", `invalid body_limit "1GiB": want a size such as 64KiB, at most 16MiB (16777216 bytes)`, 3},
		{"body_limit past 16MiB", "rate_limit {\n\tbody_limit 16777217\n}", `invalid body_limit "16777217"`, 3},
		{"huge events", "rate_limit {\n\tzone a {\n\t\tevents 9223372036854775807\n\t\twindow 1m\n\t\talgorithm leaky_bucket\n\t\tmax_delay 1s\n\t}\n}", `zone "a": max_events must be at most 1000000000000000, got 9223372036854775807`, 4},
		{"huge rate", "rate_limit {\n\tzone a {\n\t\trate 9223372036854775807/1m\n\t\talgorithm fixed_window\n\t}\n}", `zone "a": max_events must be at most 1000000000000000`, 4},
		{"huge burst", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\talgorithm gcra\n\t\tburst 9223372036854775807\n\t}\n}", `zone "a": burst must be at most 1000000000000000`, 6},
		{"huge window", "rate_limit {\n\tzone a {\n\t\trate 10/1000000h\n\t}\n}", `zone "a": window must be at most 73 years`, 4},
		{"huge max_keys", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tmax_keys 9223372036854775807\n\t}\n}", `zone "a": max_keys must be at most 1073741824`, 5},
		{"huge scope events", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\tevents 4611686018427387904\n\t\t\twindow 1m\n\t\t\talgorithm sliding_window_counter\n\t\t}\n\t}\n}", `zone "a" scope "s": max_events must be at most 1000000000000000`, 5},
		{"zone name quoted once", "rate_limit {\n\tzone a {\n\t\tevents 0\n\t\twindow 1m\n\t}\n}", `zone "a": events must be`, 4},
		{"allow not an address", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tallow 10.0.0.300\n\t}\n}", `"10.0.0.300" is not an address or a network`, 5},
		{"max_delay on a zone of scopes", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 1/s\n\t\t\talgorithm leaky_bucket\n\t\t}\n\t\tmax_delay 1s\n\t}\n}", `zone "a": max_delay would do nothing on a zone without a rate of its own`, 8},
		{"max_keys on a zone of scopes", "rate_limit {\n\tzone a {\n\t\tmax_keys 10\n\t\tscope s {\n\t\t\trate 1/s\n\t\t}\n\t}\n}", `zone "a": max_keys would do nothing`, 4},
		{"by on a zone of scopes", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 1/s\n\t\t}\n\t\tby subnet\n\t}\n}", `zone "a": key, ipv4_prefix, ipv6_prefix would do nothing`, 7},
		{"missing on a zone of scopes", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 1/s\n\t\t}\n\t\tmissing deny\n\t}\n}", `zone "a": missing would do nothing`, 7},
		{"missing with by global", "rate_limit {\n\tzone a {\n\t\tby global\n\t\trate 1/s\n\t\tmissing deny\n\t}\n}", `zone "a": missing would do nothing: the key "global" has no placeholder`, 6},
		{"shadow with value", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tshadow yes\n\t}\n}", "wrong argument count", 5},
		{"lease 0", "rate_limit {\n\tzone a {\n\t\trate 1000/1m\n\t\tlease 0\n\t}\n}", `lease must be a whole number ≥ 1, got "0"`, 5},
		{"lease above 1%", "rate_limit {\n\tzone a {\n\t\trate 1000/1m\n\t\tlease 50\n\t}\n}", `zone "a": lease 50 is more than 1% of rate 1000/1m (10)`, 5},
		{"lease in a scope", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 100/1h\n\t\t\tlease 2\n\t\t}\n\t}\n}", `zone "a" scope "s": lease 2 is more than 1% of rate 100/1h (1)`, 6},
		{"bad headers", "rate_limit {\n\theaders ietf\n}", `headers must be draft, legacy, both or none, got "ietf"`, 3},
		{"headers twice", "rate_limit {\n\theaders draft\n\theaders none\n}", "headers already specified", 4},
		{"bad respond", "rate_limit {\n\trespond html\n}", `respond must be json, problem or text, got "html"`, 3},
		{"bad zone headers", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\theaders x-ratelimit\n\t}\n}", `zone "a": headers must be draft, legacy, both or none`, 5},
		{"zone status 200", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tstatus 200\n\t}\n}", `zone "a": status must be from 400 to 599, got "200"`, 5},
		{"zone status word", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tstatus slow\n\t}\n}", `zone "a": status must be from 400 to 599, got "slow"`, 5},
		{"zone status twice", "rate_limit {\n\tzone a {\n\t\trate 1/s\n\t\tstatus 429\n\t\tstatus 503\n\t}\n}", "status already specified", 6},
		{"status in a scope", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 1/s\n\t\t\tstatus 700\n\t\t}\n\t}\n}", `zone "a" scope "s": status must be from 400 to 599, got "700"`, 6},
		{"cost min on a constant", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost 5 min 8\n\t}\n}", `zone "a": cost_min applies to a cost read from the request`, 5},
		{"cost min 0", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost {http.request.body.size} min 0\n\t}\n}", `cost: min must be a whole number ≥ 1, got "0"`, 5},
		{"cost min above the limit", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost {http.request.body.size} min 11\n\t}\n}", `zone "a": cost_min 11 can never pass: the limit holds at most 10 units`, 5},
		{"cost min above a scope's burst", "rate_limit {\n\tzone a {\n\t\tscope s {\n\t\t\trate 100/1m\n\t\t\talgorithm token_bucket\n\t\t\tburst 20\n\t\t\tcost {http.request.body.size} min 21\n\t\t}\n\t}\n}", `zone "a" scope "s": cost_min 21 can never pass: the limit holds at most 20 units (raise burst)`, 8},
		{"cost min without a number", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost {http.request.body.size} min\n\t}\n}", "cost: min needs a whole number", 5},
		{"cost with another word", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost {http.request.body.size} max 5\n\t}\n}", `cost: after the cost only min <n> may follow, got "max"`, 5},
		{"cost min with more", "rate_limit {\n\tzone a {\n\t\trate 10/1m\n\t\tcost {http.request.body.size} min 5 6\n\t}\n}", `cost: nothing may follow min 5, got "6"`, 5},
		{"cost min above a lease", "rate_limit {\n\tzone a {\n\t\tkey {http.request.header.X-Tenant}\n\t\trate 100000/1m\n\t\talgorithm token_bucket\n\t\tlease 100\n\t\tcost {http.request.header.X-Cost} min 200\n\t}\n}", `zone "a": lease 100 is less than cost_min 200`, 7},
		{"algorithm on its own line", "rate_limit {\n\tzone a {\n\t\tkey static\n\t\trate 10/1m\n\t\talgorithm tokenbucket\n\t}\n}", `unknown algorithm "tokenbucket"`, 6},
	}
	// The line is the offending option's, not the zone's.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ":8080\n" + tt.block + "\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
			if err == nil {
				t.Fatalf("adapted without error:\n%s", cfg)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
			if line := "Caddyfile:" + strconv.Itoa(tt.line); !strings.Contains(err.Error(), line) {
				t.Fatalf("error %q does not name %s", err, line)
			}
		})
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in     string
		events int64
		window string
	}{
		{"100/1m", 100, "1m0s"},
		{"10/s", 10, "1s"},
		{"1000/h", 1000, "1h0m0s"},
		{"5/1h30m", 5, "1h30m0s"},
		{"2/1d", 2, "24h0m0s"},
		{"3/d", 3, "24h0m0s"},
		{"7/.5s", 7, "500ms"},
	}
	for _, tt := range tests {
		n, w, err := ParseRate(tt.in)
		if err != nil || n != tt.events || w.String() != tt.window {
			t.Errorf("ParseRate(%q) = %d, %v, %v; want %d, %s", tt.in, n, w, err, tt.events, tt.window)
		}
	}
	for _, bad := range []string{"", "100", "/1m", "0/1m", "-1/1m", "x/1m", "10/", "10/0s", "10/-1m", "10/fortnight"} {
		if _, _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
}

func TestCaddyfileGlobalOptionErrors(t *testing.T) {
	tests := []struct{ name, globals, want string }{
		{"argument", "rate_limit foo {\n}", "wrong argument count"},
		{"unknown option", "rate_limit {\n\tjitter 0.5\n}", `unrecognized rate_limit global option "jitter"`},
		{"backend twice", "rate_limit {\n\tbackend memory\n\tbackend memory\n}", "backend given twice"},
		{"unknown backend", "rate_limit {\n\tbackend etcd\n}", "getting module named 'http.rate_limit.backends.etcd'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := "{\n" + tt.globals + "\n}\n:8080 {\n\trespond ok\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
