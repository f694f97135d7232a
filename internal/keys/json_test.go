package keys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestJSONField(t *testing.T) {
	doc := `{"phone": "01712345678", "n": 8801712345678, "ok": true, "f": false, "user": {"email": "a@b.co", "tags": ["x", {"id": 7}]}, "nil": null, "obj": {}, "esc": "a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "0": "zero"}`
	tests := []struct {
		path, want string
		err        error // nil: found
	}{
		{"phone", "01712345678", nil},
		{"n", "8801712345678", nil},
		{"ok", "true", nil},
		{"f", "false", nil},
		{"user.email", "a@b.co", nil},
		{"user.tags.0", "x", nil},
		{"user.tags.1.id", "7", nil},
		{"esc", "a\"\\/\b\f\n\r\té😀", nil},
		{"0", "zero", nil},
		{"user.tags.2", "", ErrAbsent},
		{"user.tags.00", "", ErrAbsent}, // not an index a parser reads as 0
		{"user.tags.+0", "", ErrAbsent},
		{"user.missing", "", ErrAbsent},
		{"nil", "", ErrAbsent},
		{"phone.x", "", ErrAbsent},
		{"obj", "", ErrUnreadable},
		{"user", "", ErrUnreadable},
		{"user.tags", "", ErrUnreadable},
	}
	for _, tt := range tests {
		got, err := JSONField([]byte(doc), tt.path)
		if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s → %q, %v; want %q, %v", tt.path, got, err, tt.want, tt.err)
		}
	}
}

// A document that is not valid JSON (RFC 8259, UTF-8) is unreadable, for
// every path, wherever the fault is.
func TestJSONFieldInvalid(t *testing.T) {
	for name, bad := range map[string]string{
		"empty":              ``,
		"unclosed":           `{"phone": "1"`,
		"trailing data":      `{"phone": "1"} x`,
		"two documents":      `{"phone": "1"} {}`,
		"not json":           `phone=1`,
		"trailing comma":     `{"phone": "1", "x": [1, 2,]}`,
		"object comma":       `{"phone": "1",}`,
		"missing colon":      `{"phone" "1"}`,
		"unquoted key":       `{phone: "1"}`,
		"single quotes":      `{'phone': '1'}`,
		"leading zero":       `{"phone": "1", "n": 01}`,
		"bare minus":         `{"phone": "1", "n": -}`,
		"dot without digits": `{"phone": "1", "n": 1.}`,
		"exponent alone":     `{"phone": "1", "n": 1e}`,
		"plus sign":          `{"phone": "1", "n": +1}`,
		"NaN":                `{"phone": "1", "n": NaN}`,
		"bad literal":        `{"phone": "1", "n": tru}`,
		"control char":       "{\"phone\": \"1\t\"}",
		"bad escape":         `{"phone": "\x"}`,
		"short \\u":          `{"phone": "\u12"}`,
		"lone high":          `{"phone": "\ud800"}`,
		"lone low":           `{"phone": "\udc00"}`,
		"high then non-low":  `{"phone": "\ud800\u0041"}`,
		"invalid UTF-8":      "{\"phone\": \"1\xff\"}",
		"invalid UTF-8 key":  "{\"x\xc3\": 1, \"phone\": \"1\"}",
		"overlong UTF-8":     "{\"phone\": \"\xc0\xaf\"}",
		"surrogate in UTF-8": "{\"phone\": \"\xed\xa0\x80\"}",
		"BOM":                "\uFEFF{\"phone\": \"1\"}",
		"UTF-16 BOM":         "\xff\xfe{\x00}\x00",
		"UTF-16":             "{\x00\"\x00p\x00\"\x00:\x001\x00}\x00",
		"too deep":           strings.Repeat(`[`, 65) + strings.Repeat(`]`, 65),
		"too deep on path":   `{"phone": ` + strings.Repeat(`{"a":`, 64) + `1` + strings.Repeat(`}`, 64) + `}`,
		"NUL":                "{\"phone\": \"1\"}\x00",
	} {
		if got, err := JSONField([]byte(bad), "phone"); !errors.Is(err, ErrUnreadable) {
			t.Errorf("%s: %q, %v; want ErrUnreadable", name, got, err)
		}
	}
	// 64 levels are fine.
	deep := strings.Repeat(`[`, 63) + `{"phone": "1"}` + strings.Repeat(`]`, 63)
	if _, err := JSONField([]byte(deep), "phone"); !errors.Is(err, ErrAbsent) {
		t.Errorf("64 levels: %v", err)
	}
}

// A key on the path given twice, in any mix of cases or escapes, is
// ambiguous; a repeated key off the path is the application's business.
func TestJSONFieldAmbiguous(t *testing.T) {
	for doc, path := range map[string]string{
		`{"phone": "1", "phone": "2"}`:              "phone",
		`{"phone": "1", "PHONE": "2"}`:              "phone",
		`{"Phone": "1", "phone": "2"}`:              "phone",
		`{"phone": "1", "ph\u006fne": "1"}`:         "phone",
		`{"phone": "1", "phone": null}`:             "phone",
		`{"phone": "1", "phone": {"a": 1}}`:         "phone",
		`{"user": {"ID": 1, "id": 2}}`:              "user.id",
		`{"user": {"id": 1}, "User": {"name": 2}}`:  "user.id",
		`{"user": {"id": 1}, "user": "x"}`:          "user.id",
		`{"a": [{"id": 1, "id": 1}]}`:               "a.0.id",
		`{"phone": "1", "\u212Aey": 1, "key": 2}`:   "key", // the Kelvin sign folds to k
		`{"phone": "1", "phone": "1", "phone": ""}`: "phone",
	} {
		if got, err := JSONField([]byte(doc), path); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s → %q, %v; want ErrAmbiguous", doc, got, err)
		}
	}
	for doc, want := range map[string]string{
		`{"x": 1, "x": 2, "phone": "5"}`:             "5",
		`{"PHONE": "5"}`:                             "5",
		`{"a": {"phone": 1}, "phone": "5"}`:          "5",
		`{"phone": "5", "a": [{"phone": 1}]}`:        "5",
		`{"ph\u006fne": "5", "a": {"x": 1, "x": 2}}`: "5",
	} {
		if got, err := JSONField([]byte(doc), "phone"); err != nil || got != want {
			t.Errorf("%s → %q, %v; want %q", doc, got, err, want)
		}
	}
}

func TestCanonicalNumber(t *testing.T) {
	many := "42." + strings.Repeat("0", 100000)
	for want, spellings := range map[string][]string{
		"42":                      {"42", "42.0", "4.2e1", "420e-1", "0.42E+2", "4200000e-5", "42e0", many, "42.000000000000000000001"},
		"0":                       {"0", "-0", "0.0", "-0.0e5", "0e-99999999999", "1e-400", "-1e-999999999"},
		"-42":                     {"-42", "-4.2e1", "-42.00"},
		"0.5":                     {"0.5", "5e-1", "0.50", "50e-2"},
		"1e-07":                   {"1e-7", "0.0000001"},
		"1000000000000000000000":  {"1e21", "1000000000000000000000", "1000000000000000000000.0"},
		"9007199254740992":        {"9007199254740992", "9007199254740993", "9.007199254740993e15"},
		"9223372036854776000":     {"9223372036854775807", "9223372036854775808", "9.223372036854776e18"},
		"123456789012345":         {"123456789012345", "1.23456789012345e14"},
		"Infinity":                {"1e999999999", "1E+99999999999999999999", "2e400", "1" + strings.Repeat("0", 400)},
		"-Infinity":               {"-1e400"},
		"1.7976931348623157e+308": {"1.7976931348623157e308"},
	} {
		for _, s := range spellings {
			got := CanonicalNumber([]byte(s))
			if want == "1.7976931348623157e+308" {
				want = strconv.FormatFloat(math.MaxFloat64, 'f', -1, 64)
			}
			if got != want {
				t.Errorf("%.40s → %.40q, want %.40q", s, got, want)
			}
		}
	}
}

// Huge exponents and long mantissas cost time linear in their length.
func TestCanonicalNumberBounded(t *testing.T) {
	for _, s := range []string{"1e999999999999999999999999999", "-1e-999999999999999999999", "0." + strings.Repeat("0", 60000) + "1e60001", strings.Repeat("9", 60000) + "e-60000"} {
		start := time.Now()
		CanonicalNumber([]byte(s))
		// A generous bound: microseconds in practice; an algorithm that
		// followed the exponent would take hours.
		if d := time.Since(start); d > time.Second {
			t.Errorf("%.30s…: %v", s, d)
		}
	}
	if got := CanonicalNumber([]byte("0." + strings.Repeat("0", 60000) + "1e60001")); got != "1" {
		t.Errorf("0.000…1e60001 = %q, want 1", got)
	}
}

// Several paths come out of one pass, each with its own result.
func TestJSONPathsOnePass(t *testing.T) {
	var q JSONPaths
	paths := []string{"phone", "user.id", "user.ID", "items.1", "items.1.x", "none", "user", "dup", "tokens"}
	for i, p := range paths {
		if got := q.Add(p); got != i {
			t.Fatalf("Add(%q) = %d, want %d", p, got, i)
		}
	}
	if q.Add("phone") != 0 || q.Len() != len(paths) {
		t.Fatal("a path added twice is one path")
	}
	doc := `{"phone": "017", "user": {"id": 4.20e1}, "items": [0, "one"], "dup": 1, "DUP": 2, "tokens": 10}`
	res := q.Extract([]byte(doc), nil)
	want := []struct {
		v   string
		err error
	}{{"017", nil}, {"42", nil}, {"42", nil}, {"one", nil}, {"", ErrAbsent}, {"", ErrAbsent}, {"", ErrUnreadable}, {"", ErrAmbiguous}, {"10", nil}}
	for i, w := range want {
		if res[i].Value != w.v || (w.err == nil) != (res[i].Err == nil) || w.err != nil && !errors.Is(res[i].Err, w.err) {
			t.Errorf("%s → %q, %v; want %q, %v", paths[i], res[i].Value, res[i].Err, w.v, w.err)
		}
	}
	// More than 64 paths take more than one pass, with the same results.
	var many JSONPaths
	for i := 0; i < 150; i++ {
		many.Add(fmt.Sprintf("k%d", i))
	}
	for i, r := range many.Extract(nil, nil) {
		if !errors.Is(r.Err, ErrUnreadable) {
			t.Fatalf("path %d of an empty document: %v", i, r.Err)
		}
	}
	res = many.Extract([]byte(`{"k0": 0, "k64": 64, "k149": 149, "k100": 1, "k100": 2}`), res)
	if res[0].Value != "0" || res[64].Value != "64" || res[149].Value != "149" || !errors.Is(res[100].Err, ErrAmbiguous) || !errors.Is(res[1].Err, ErrAbsent) {
		t.Fatalf("150 paths: %v %v %v %v %v", res[0], res[64], res[149], res[100], res[1])
	}
}

// The parser agrees with encoding/json on what is valid (except for
// invalid UTF-8 and lone surrogates, which it refuses) and on the values
// it finds.
func FuzzJSONField(f *testing.F) {
	for _, s := range []string{
		`{"phone": "01712345678", "user": {"id": [1, 2]}}`, `{"a":{"a":{"a":"x"}}}`, `[1,{"b":true}]`,
		`{"phone": 4.2e1}`, `{"phone": "\u00e9"}`, `{"PHONE": 1}`, `{"phone": null}`, ` {"phone" : [ ] } `,
	} {
		f.Add([]byte(s), "phone")
	}
	f.Add([]byte(`{"a":[1,{"b":true}]}`), "a.1.b")
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		v, err := JSONField(data, path)
		if err == nil && len(v) > len(data) && !numeric(v) {
			t.Fatalf("value %q longer than the document", v)
		}
		valid := json.Valid(data) && strictText(data)
		if valid == errors.Is(err, ErrUnreadable) && !compositeErr(err) {
			t.Fatalf("valid %v (encoding/json), error %v", valid, err)
		}
		if !valid || strings.Contains(path, ".") || path == "" {
			return
		}
		// One level: compare with encoding/json's view of an object.
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if dec.Decode(&obj) != nil || obj == nil {
			return
		}
		var matches []any
		for k, x := range obj {
			if strings.EqualFold(k, path) {
				matches = append(matches, x)
			}
		}
		if len(matches) == 1 && !errors.Is(err, ErrAmbiguous) {
			want, ok := scalar(matches[0])
			switch {
			case ok && (err != nil || v != want):
				t.Fatalf("%s: %q, %v; encoding/json reads %q", path, v, err, want)
			case !ok && matches[0] != nil && !errors.Is(err, ErrUnreadable):
				t.Fatalf("%s: %q, %v; encoding/json reads a composite", path, v, err)
			}
		}
		if len(matches) == 0 && !errors.Is(err, ErrAbsent) && !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("%s: %q, %v; encoding/json finds no such key", path, v, err)
		}
	})
}

// One pass for several paths finds what one pass per path finds.
func FuzzJSONPaths(f *testing.F) {
	f.Add([]byte(`{"a": {"b": [1, {"c": "x"}]}, "A": 2}`), "a.b.1.c", "a.b", "A")
	f.Add([]byte(`{"user": {"id": 1, "ID": 2}, "n": 3}`), "user.id", "n", "user")
	f.Fuzz(func(t *testing.T, data []byte, p1, p2, p3 string) {
		var q JSONPaths
		paths := []string{p1, p2, p3}
		for _, p := range paths {
			q.Add(p)
		}
		res := q.Extract(data, nil)
		for _, p := range paths {
			v, err := JSONField(data, p)
			r := res[q.index(p)]
			if v != r.Value || (err == nil) != (r.Err == nil) || err != nil && err.Error() != r.Err.Error() {
				t.Fatalf("%s: one pass %q, %v; alone %q, %v", p, r.Value, r.Err, v, err)
			}
		}
	})
}

func numeric(v string) bool {
	_, err := strconv.ParseFloat(v, 64)
	return err == nil || v == "Infinity"
}

func compositeErr(err error) bool {
	return err != nil && strings.Contains(err.Error(), "an object or array")
}

// strictText reports whether data (valid JSON for encoding/json) holds
// no invalid UTF-8 and no lone surrogate escape, which encoding/json
// accepts and this parser does not.
func strictText(data []byte) bool {
	if !utf8.Valid(data) {
		return false
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if data[i+1] != 'u' {
			i++
			continue
		}
		r, _ := hex4(data[i+2:])
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return false
		case r >= 0xd800 && r < 0xdc00:
			if i+12 > len(data) || data[i+6] != '\\' || data[i+7] != 'u' {
				return false
			}
			if r2, ok := hex4(data[i+8:]); !ok || r2 < 0xdc00 || r2 > 0xdfff {
				return false
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

func scalar(x any) (string, bool) {
	switch x := x.(type) {
	case string:
		return x, true
	case json.Number:
		return CanonicalNumber([]byte(x.String())), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// badBody is 64 KiB of zeros in an array, then the key field: the body
// that took 47 times json.Valid with a token-by-token decoder.
func badBody() []byte {
	return []byte(`{"a":[` + strings.Repeat("0,", 32747) + `0],"phone":"01712345678"}`)
}

var benchBodies = map[string][]byte{
	"zeros64KiB": badBody(),
	"otp":        []byte(`{"phone": "+8801712345678"}`),
	"login":      []byte(`{"username": "rakib@example.com", "password": "correct horse battery staple", "remember": true}`),
	"nested":     []byte(`{"user": {"id": 4.2e1, "name": "Rakib", "tags": ["a", "b", "c"]}, "items": [{"sku": "X1", "n": 2}, {"sku": "Y2", "n": 1}], "note": "h\u00e9llo"}`),
}

var benchPaths = map[string]string{"zeros64KiB": "phone", "otp": "phone", "login": "username", "nested": "user.id"}

// Finding a field costs at most 3 times json.Valid on the same bytes:
// compare json.Valid with Extract, the work of a request (its paths were
// prepared at provision). JSONField prepares the path on every call too.
func BenchmarkJSONField(b *testing.B) {
	for _, name := range []string{"zeros64KiB", "otp", "login", "nested"} {
		data, path := benchBodies[name], benchPaths[name]
		var q JSONPaths
		q.Add(path)
		b.Run(name+"/json.Valid", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if !json.Valid(data) {
					b.Fatal("invalid")
				}
			}
		})
		b.Run(name+"/Extract", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			var buf [1]Result // as a Body keeps them
			for b.Loop() {
				if r := q.Extract(data, buf[:0]); r[0].Err != nil {
					b.Fatal(r[0].Err)
				}
			}
		})
		b.Run(name+"/JSONField", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := JSONField(data, path); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The ratio the benchmark above shows, checked: on the bad body and on
// small ones, finding a field costs at most 3 times json.Valid. The two are
// timed in alternating rounds of one run and the best round of each kept,
// so a busy machine slows both alike; a ratio over 3 is measured twice
// more before it fails (a parser that is really slower fails all three).
func TestJSONFieldWithin3xValid(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("timing")
	}
	for _, name := range []string{"zeros64KiB", "otp", "login", "nested"} {
		data := benchBodies[name]
		var q JSONPaths
		q.Add(benchPaths[name])
		valid := func() { json.Valid(data) }
		var buf [1]Result // as a Body keeps them
		field := func() { q.Extract(data, buf[:0]) }
		n := 1
		for elapsed(valid, n) < 5*time.Millisecond {
			n *= 2
		}
		var ratio float64
		for attempt := 0; attempt < 3; attempt++ {
			bestValid, bestField := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
			for round := 0; round < 7; round++ {
				bestValid = min(bestValid, elapsed(valid, n))
				bestField = min(bestField, elapsed(field, n))
			}
			ratio = float64(bestField) / float64(bestValid)
			t.Logf("%s (%d bytes): Extract %v, json.Valid %v per op: %.2f×", name, len(data), bestField/time.Duration(n), bestValid/time.Duration(n), ratio)
			if ratio <= 3 {
				break
			}
		}
		if ratio > 3 {
			t.Errorf("%s: Extract takes %.2f × json.Valid, want at most 3", name, ratio)
		}
	}
}

func elapsed(f func(), n int) time.Duration {
	start := time.Now()
	for i := 0; i < n; i++ {
		f()
	}
	return time.Since(start)
}
