package keys

import (
	"errors"
	"strings"
	"testing"
)

func mustNorm(t *testing.T, name, region string, aliases bool) Normalizer {
	t.Helper()
	n, err := NewNormalizer(name, region, aliases)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Seed part 10.5: each row's spellings must become one key, and values
// that are not identifiers of the kind must be refused.
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
		{"phone US", mustNorm(t, NormPhone, "US", false),
			[]string{"(201) 555-0123", "+1 201 555 0123", "12015550123", "201.555.0123"},
			"+12015550123"},
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
			[]string{"/api/v1/x", "/api/v1/x/", "/API/V1/X", "/api//v1/x", "/api/./v1/x", "/api/v1/y/../x", "/api/v1/%78", "/api/v1/x?page=2", "api/v1/x"},
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
		{"phone", mustNorm(t, NormPhone, "BD", false), []string{"", "hello", "123", "+99999999999999999", "01712", huge, "\xff\xfe", "0171234567890123"}},
		{"email", mustNorm(t, NormEmail, "", false), []string{"", "rakib", "@example.com", "rakib@", "ra kib@example.com", "a@b@c", "rakib@localhost", huge + "@example.com", "\xff@\xfe"}},
		{"email aliases", mustNorm(t, NormEmail, "", true), []string{"+tag@gmail.com", "...@gmail.com"}},
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

func FuzzNormalizers(f *testing.F) {
	for _, s := range []string{"01712345678", "r.a.kib+x@gmail.com", "/api/v1/%78/", "ＡＤＭＩＮ", "\xff", "", "+", "@", "%", "/../.."} {
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
		}
	})
}
