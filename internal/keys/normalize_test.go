package keys

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

func mustNorm(t *testing.T, name, region string, aliases bool) Normalizer {
	t.Helper()
	n, err := NewNormalizer(name, region, aliases)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Each row's spellings must become one key, and values that are not
// identifiers of the kind must be refused.
func TestNormalizersBypassTable(t *testing.T) {
	tests := []struct {
		name      string
		norm      Normalizer
		spellings []string
		want      string
	}{
		{"phone BD: +880 / 880 / 0", mustNorm(t, NormPhone, "BD", false),
			[]string{"01712345678", "+8801712345678", "8801712345678", "+880 1712-345678", " 01712 345 678 ", "(+880) 1712345678", "０１７１２３４５６７８"},
			"+8801712345678"},
		{"phone BD: digits of every script", mustNorm(t, NormPhone, "BD", false),
			[]string{
				"০১৭১২৩৪৫৬৭৮", "+৮৮০১৭১২৩৪৫৬৭৮", "৮৮০ ১৭১২-৩৪৫৬৭৮", // Bengali
				"०१७१२३४५६७८",    // Devanagari
				"٠١٧١٢٣٤٥٦٧٨",    // Arabic-Indic
				"۰۱۷۱۲۳۴۵۶۷۸",    // Extended Arabic-Indic
				"๐๑๗๑๒๓๔๕๖๗๘",    // Thai
				"၀၁၇၁၂၃၄၅၆၇၈",    // Myanmar
				"𝟎𝟏𝟕𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖",    // mathematical bold
				"০1712৩৪৫৬৭৮",    // mixed
				"＋８８０１７１２３４５６７８", // full-width
			},
			"+8801712345678"},
		{"phone US", mustNorm(t, NormPhone, "US", false),
			[]string{"(201) 555-0123", "+1 201 555 0123", "12015550123", "201.555.0123"},
			"+12015550123"},
		{"credentials: scheme case and spacing", mustNorm(t, NormCredentials, "", false),
			[]string{"Bearer tok.EN_1", "bearer tok.EN_1", "BEARER tok.EN_1", "Bearer  tok.EN_1", "bEarer\ttok.EN_1", " Bearer tok.EN_1 "},
			"bearer tok.EN_1"},
		{"email case", mustNorm(t, NormEmail, "", false),
			[]string{"Rakib@Example.com", "rakib@example.com", " RAKIB@EXAMPLE.COM ", "rakib@example.com.", "ｒａｋｉｂ@example.com"},
			"rakib@example.com"},
		{"email aliases: gmail dots and +tag", mustNorm(t, NormEmail, "", true),
			[]string{"r.a.kib+x@gmail.com", "rakib@gmail.com", "Rakib+promo@GoogleMail.com", "R.A.K.I.B@gmail.com"},
			"rakib@gmail.com"},
		{"email aliases elsewhere: +tag only", mustNorm(t, NormEmail, "", true),
			[]string{"u+1@example.org", "u@example.org", "U+shop@Example.org"},
			"u@example.org"},
		{"lower: case and compatibility forms", mustNorm(t, NormLower, "", false),
			[]string{"Admin", "ADMIN", "ａｄｍｉｎ", "ＡＤＭＩＮ", "admin"},
			"admin"},
		{"lower: Kelvin sign", mustNorm(t, NormLower, "", false),
			[]string{"\u212Aey", "Key", "KEY"},
			"key"},
		{"trim", mustNorm(t, NormTrim, "", false),
			[]string{"tok", " tok", "tok\t\n", "\u200btok\ufeff", "\u00a0tok"},
			"tok"},
		{"path: URL variants", mustNorm(t, NormPath, "", false),
			[]string{"/api/v1/x", "/api/v1/x/", "/API/V1/X", "/api//v1/x", "/api/./v1/x", "/api/v1/y/../x", "/api/v1/%78", "api/v1/x"},
			"/api/v1/x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, s := range tt.spellings {
				got, err := tt.norm(s)
				if err != nil || got != tt.want {
					t.Errorf("%q → %q, %v; want %q", s, got, err, tt.want)
				}
			}
		})
	}
}

func TestNormalizersRefuse(t *testing.T) {
	huge := strings.Repeat("9", maxValue+1)
	tests := []struct {
		name   string
		norm   Normalizer
		inputs []string
	}{
		{"credentials", mustNorm(t, NormCredentials, "", false), []string{"", "tok", "Bearer", "Bearer a b", "Bearer to\x00k", "Bearer tok\u200b", "Bearer \xff"}},
		{"phone", mustNorm(t, NormPhone, "BD", false), []string{"", "hello", "123", "+99999999999999999", "01712", huge, "\xff\xfe", "0171234567890123"}},
		{"phone: invisible characters", mustNorm(t, NormPhone, "BD", false), []string{
			"0171\u200b2345678", "\u200b01712345678", "01712345678\ufeff", "0171\u00ad2345678",
			"+880\u202e1712345678", "0171\x002345678", "01712\u2060345678", "০১৭১\u200c২৩৪৫৬৭৮",
			"01712\ufe0f345678", "0171\t2345678", "0171\xff2345678",
		}},
		{"email", mustNorm(t, NormEmail, "", false), []string{"", "rakib", "@example.com", "rakib@", "ra kib@example.com", "a@b@c", "rakib@localhost", huge + "@example.com", "\xff@\xfe"}},
		{"email aliases", mustNorm(t, NormEmail, "", true), []string{"+tag@gmail.com", "...@gmail.com", "rakib.+x@example.com"}},
		{"lower", mustNorm(t, NormLower, "", false), []string{huge}},
	}
	for _, tt := range tests {
		for _, in := range tt.inputs {
			if got, err := tt.norm(in); err == nil {
				t.Errorf("%s accepted %.40q as %.40q", tt.name, in, got)
			} else if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %.40q: error %v does not wrap ErrInvalid", tt.name, in, err)
			}
		}
	}
	// Invalid UTF-8 is repaired, not passed on.
	got, err := mustNorm(t, NormLower, "", false)("ab\xffc")
	if err != nil || got != "ab\uFFFDc" {
		t.Errorf("invalid UTF-8 → %q, %v", got, err)
	}
}

func TestNewNormalizerErrors(t *testing.T) {
	for _, tt := range []struct {
		name, region string
		aliases      bool
		want         string
	}{
		{"soundex", "", false, `unknown normalizer "soundex"`},
		{NormPhone, "", false, "needs a default region"},
		{NormPhone, "XX", false, `unknown region "XX"`},
		{NormLower, "BD", false, "takes no region"},
		{NormPhone, "BD", true, "takes no aliases option"},
	} {
		if _, err := NewNormalizer(tt.name, tt.region, tt.aliases); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %s %v: error %v, want %q", tt.name, tt.region, tt.aliases, err, tt.want)
		}
	}
}

// Every decimal digit of every script is read as its value: the runs of
// ten in Unicode's Nd table start at a zero, and the digits that NFKC maps
// to ASCII agree.
func TestDigitValueEveryScript(t *testing.T) {
	for _, zero := range []rune{'0', '০', '०', '٠', '۰', '๐', '၀', '０', '𝟎', '𝟶', '߀', '᠐'} {
		for i := rune(0); i < 10; i++ {
			if d, ok := digitValue(zero + i); !ok || d != i {
				t.Errorf("%U: %d, %v; want %d", zero+i, d, ok, i)
			}
		}
	}
	n := 0
	check := func(lo, hi, stride uint32) {
		if stride != 1 || (hi-lo+1)%10 != 0 {
			t.Errorf("Nd range %U-%U (stride %d) is not made of runs of ten", lo, hi, stride)
		}
		for r := rune(lo); r <= rune(hi); r++ {
			n++
			d, ok := digitValue(r)
			if !ok || d < 0 || d > 9 {
				t.Fatalf("%U: %d, %v", r, d, ok)
			}
			if nf := norm.NFKC.String(string(r)); len(nf) == 1 && nf[0]-'0' != byte(d) {
				t.Errorf("%U: value %d, NFKC says %s", r, d, nf)
			}
		}
	}
	for _, rg := range unicode.Nd.R16 {
		check(uint32(rg.Lo), uint32(rg.Hi), uint32(rg.Stride))
	}
	for _, rg := range unicode.Nd.R32 {
		check(rg.Lo, rg.Hi, rg.Stride)
	}
	for _, r := range []rune{'a', '²', '①', 'Ⅻ', '½', '.', '٫'} {
		if d, ok := digitValue(r); ok {
			t.Errorf("%U read as digit %d", r, d)
		}
	}
	t.Logf("%d decimal digits in %d scripts", n, n/10)
}

func FuzzNormalizers(f *testing.F) {
	for _, s := range []string{
		"01712345678", "r.a.kib+x@gmail.com", "/api/v1/%78/", "ＡＤＭＩＮ", "\xff", "", "+", "@", "%", "/../..",
		"০১৭১২৩৪৫৬৭৮", "+৮৮০ ১৭১২-৩৪৫৬৭৮", "0171\u200b2345678",
		"Rakib (x) <\"ra.kib\"(y)@(z)Exämple.COM.>", "\"a\\\"b\"@x.org", "rakib@xn--exmple-cua.com", "a((b)c@d.e", "<@r:a@b.c>",
		"/p1%3F/../api/login", "/api;x/..;/login", "/login%2E", "/%C0%AF", "%252e%252e/x", "/a\\b", "user=r1&user=victim;x=1",
	} {
		f.Add(s)
	}
	norms := map[string]Normalizer{}
	for _, n := range []struct {
		name, region string
		aliases      bool
	}{{NormTrim, "", false}, {NormLower, "", false}, {NormEmail, "", false}, {NormEmail, "", true}, {NormPhone, "BD", false}, {NormPath, "", false}} {
		nz, err := NewNormalizer(n.name, n.region, n.aliases)
		if err != nil {
			f.Fatal(err)
		}
		norms[n.name+n.region+map[bool]string{true: "+", false: ""}[n.aliases]] = nz
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, n := range norms {
			out, err := n(s)
			if err != nil {
				continue
			}
			// A normal form is a fixed point: normalizing again changes
			// nothing, so every spelling of it lands on one key.
			again, err := n(out)
			if err != nil || again != out {
				t.Fatalf("%s: %q → %q → %q (%v): not stable", name, s, out, again, err)
			}
			if len(out) > 4*maxValue {
				t.Fatalf("%s: output of %d bytes", name, len(out))
			}
			if bad := keyShape(name, out); bad != "" {
				t.Fatalf("%s: %q → %q: %s", name, s, out, bad)
			}
		}
	})
}

// keyShape says what is wrong with a normalizer's output, if anything:
// the invariants each kind of key keeps whatever the input.
func keyShape(name, out string) string {
	switch name {
	case NormEmail, NormEmail + "+":
		local, domain, _ := strings.Cut(out, "@")
		switch {
		case strings.Count(out, "@") != 1:
			return "not one @"
		case strings.ContainsFunc(out, invisible):
			return "invisible character"
		case !dotAtom(local):
			return "local part is not a dot-atom"
		case strings.ContainsFunc(domain, func(r rune) bool { return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '.') }):
			return "domain is not lower-case ASCII"
		}
	case NormPhone + "BD":
		if !strings.HasPrefix(out, "+") || strings.Trim(out[1:], "0123456789") != "" {
			return "not E.164"
		}
	case NormPath:
		switch {
		case !strings.HasPrefix(out, "/"):
			return "no leading slash"
		case strings.ContainsAny(out, "\\;"):
			return "backslash or ;params left"
		case strings.ContainsFunc(out, invisible):
			return "invisible character"
		case out != "/" && strings.HasSuffix(out, "/"):
			return "trailing slash"
		}
		for seg := range strings.SplitSeq(out[1:], "/") {
			if out != "/" && (seg == "" || seg == "." || seg == ".." || strings.HasSuffix(seg, ".") || strings.HasSuffix(seg, " ")) {
				return "segment " + strconv.Quote(seg) + " left"
			}
		}
	}
	return ""
}
