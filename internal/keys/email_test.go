package keys

import (
	"errors"
	"strings"
	"testing"
)

// Every spelling of one mailbox is one key: the mailbox the mail server
// delivers to.
func TestEmailOneMailbox(t *testing.T) {
	plain := mustNorm(t, NormEmail, "", false)
	aliases := mustNorm(t, NormEmail, "", true)
	tests := []struct {
		name      string
		norm      Normalizer
		spellings []string
		want      string
	}{
		{"comments", plain, []string{
			"rakib(x)@gmail.com", "(x)rakib@gmail.com", "rakib((nested)x)@gmail.com", "rakib(a\\)b)@gmail.com",
			"rakib@(x)gmail.com", "rakib@gmail.com(x)", "rakib@gmail(x).com", "rakib(x)@(y)gmail(z).com(w)",
			"rakib(@evil.com)@gmail.com", "rakib(<victim@gmail.com>)@gmail.com",
		}, "rakib@gmail.com"},
		{"angle brackets and display names", plain, []string{
			"<rakib@gmail.com>", "Rakib <rakib@gmail.com>", "\"Rakib H.\" <rakib@gmail.com>", "Rakib H. <rakib@gmail.com>",
			"\"victim@gmail.com\" <rakib@gmail.com>", "Rakib (x) <rakib(y)@gmail.com> (z)", " < rakib @ gmail.com > ",
		}, "rakib@gmail.com"},
		{"quoted local parts", plain, []string{
			"\"rakib\"@gmail.com", "\"RAKIB\"@gmail.com", "\"ra\\kib\"@gmail.com", "<\"rakib\"@gmail.com>",
		}, "rakib@gmail.com"},
		{"quoted words with dots", plain, []string{
			"\"ra\".kib@gmail.com", "\"ra.kib\"@gmail.com", "ra.\"kib\"@gmail.com", "ra . kib@gmail.com",
		}, "ra.kib@gmail.com"},
		{"case, white space, trailing dot, compatibility forms", plain, []string{
			"Rakib@Gmail.COM", " rakib@gmail.com ", "rakib @ gmail.com", "rakib@gmail.com.", "ｒａｋｉｂ@gmail.com",
			"rakib@ｇｍａｉｌ．ｃｏｍ", "rakib@gmail。com", "rakib@GMAIL.com.",
		}, "rakib@gmail.com"},
		{"IDN: U-labels and A-labels", plain, []string{
			"rakib@exämple.com", "rakib@EXÄMPLE.com", "rakib@exa\u0308mple.com", "rakib@xn--exmple-cua.com",
			"rakib@XN--EXMPLE-CUA.COM", "rakib@xn--exmple-cua.com.", "Rakib <rakib@(x)exämple.com>",
		}, "rakib@xn--exmple-cua.com"},
		{"IDN in the top label", plain, []string{"u@例え.テスト", "u@xn--r8jz45g.xn--zckzah"}, "u@xn--r8jz45g.xn--zckzah"},
		{"aliases with every spelling", aliases, []string{
			"r.a.kib+x@gmail.com", "\"r.a.kib+x\"@googlemail.com", "Rakib <R.A.KIB+promo(c)@GoogleMail.com.>", "rakib(x)@gmail.com",
		}, "rakib@gmail.com"},
		{"aliases elsewhere keep dots", aliases, []string{"r.a+1@exämple.com", "<\"r.a\"@xn--exmple-cua.com>"}, "r.a@xn--exmple-cua.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, s := range tt.spellings {
				if got, err := tt.norm(s); err != nil || got != tt.want {
					t.Errorf("%q → %q, %v; want %q", s, got, err, tt.want)
				}
			}
		})
	}
}

// What a mail server would not deliver to one plain mailbox, or what
// applications read differently, is refused: never a new key.
func TestEmailRefused(t *testing.T) {
	tests := []struct {
		name   string
		inputs []string
	}{
		{"invisible characters", []string{
			"rakib\x00@gmail.com", "rakib@gmail.com\x00", "ra\u00adkib@gmail.com", "rakib@gm\u00adail.com",
			"rakib\u200b@gmail.com", "\u200brakib@gmail.com", "\ufeffrakib@gmail.com", "rakib@gma\u200dil.com",
			"rakib\u202e@gmail.com", "\u2066rakib@gmail.com\u2069", "rakib\u200e@gmail.com", "rakib\ufe0f@gmail.com",
			"rakib\u3164@gmail.com", "rakib\u180e@gmail.com", "rakib\t@gmail.com", "rakib@gmail.com\nBcc: x@y.z",
			"\"ra\u200bkib\"@gmail.com", "rakib(\u200b)@gmail.com", "rakib\U000E0041@gmail.com", "rakib\xff@gmail.com", "rakib@gmail.com\xc0\xae",
		}},
		{"several @ outside quotes", []string{
			"a@b@gmail.com", "rakib@gmail.com@evil.com", "victim@gmail.com <rakib@gmail.com>", "<a@b@gmail.com>",
			"@gmail.com", "rakib@", "@", "rakib", "<>", "Rakib <>",
		}},
		{"quoted parts that are not plain names", []string{
			"\"a@b\"@gmail.com", "\"ra kib\"@gmail.com", "\".rakib\"@gmail.com", "\"rakib.\"@gmail.com", "\"\"@gmail.com",
			"\"a\\\"b\"@gmail.com", "\"ra\"\"kib\"@gmail.com", "ra\"kib\"@gmail.com", "\"rakib\"@\"gmail.com\"",
		}},
		{"broken syntax", []string{
			"rakib(@gmail.com", "rakib)@gmail.com", "\"rakib@gmail.com", "<rakib@gmail.com", "rakib@gmail.com>",
			"<<rakib@gmail.com>>", "<rakib@gmail.com> x", "\\rakib@gmail.com", "ra kib@example.com", "ra(x)kib@gmail.com",
			"rakib..x@gmail.com", ".rakib@gmail.com", "rakib.@gmail.com", "rakib＠gmail.com", "ra＠kib@gmail.com",
			"ra．．kib@gmail.com",
		}},
		{"lists, groups, routes, literals", []string{
			"a@gmail.com, b@gmail.com", "g: rakib@gmail.com;", "<@relay.com:rakib@gmail.com>", "rakib@[192.0.2.1]",
			"rakib@[IPv6:2001:db8::1]",
		}},
		{"domains no mail server delivers to", []string{
			"rakib@localhost", "rakib@192.0.2.1", "rakib@gmail..com", "rakib@.gmail.com", "rakib@gmail.com..",
			"rakib@-gmail.com", "rakib@gma_il.com", "rakib@xn--zz.com", "rakib@xn--.com", "rakib@xn--abc-.com",
			"rakib@" + strings.Repeat("a", 64) + ".com", "rakib@" + strings.Repeat("a.", 127) + "com",
			"rakib@gmail.c%om", "rakib@gmail.com:25",
		}},
		{"domains the IDNA standards disagree on", []string{"rakib@faß.de", "rakib@FAß.de", "rakib@ςa.gr"}},
		{"local part over 64 bytes", []string{strings.Repeat("a", 65) + "@gmail.com"}},
	}
	for _, aliases := range []bool{false, true} {
		n := mustNorm(t, NormEmail, "", aliases)
		for _, tt := range tests {
			for _, in := range tt.inputs {
				if got, err := n(in); err == nil {
					t.Errorf("%s (aliases %v): %q accepted as %q", tt.name, aliases, in, got)
				} else if !errors.Is(err, ErrInvalid) {
					t.Errorf("%s: %q: error %v does not wrap ErrInvalid", tt.name, in, err)
				}
			}
		}
	}
}
