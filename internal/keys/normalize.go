package keys

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nyaruka/phonenumbers"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// A Normalizer turns the spellings of one identifier into one key, so that
// an attacker cannot split a limit by writing the same phone number, email
// or path differently. An error means the value is not a valid identifier
// of its kind; the zone's missing-key policy applies. A normalizer that
// cannot tell what the application behind it will read refuses the value
// rather than guess: a refused value shares one quota, a wrong guess would
// be a fresh one.
type Normalizer func(string) (string, error)

// Normalizer names, as written in the `normalize` option.
const (
	NormTrim  = "trim"
	NormLower = "lower"
	NormEmail = "email"
	NormPhone = "phone"
	NormPath  = "path"
	// NormCredentials reads an Authorization-style value, "<scheme>
	// <credentials>".
	NormCredentials = "credentials"
)

// ErrInvalid is the error of a value a normalizer cannot read.
var ErrInvalid = errors.New("not a valid identifier")

// maxValue bounds what a normalizer reads; longer values are refused
// rather than scanned, so a huge header cannot cost much CPU.
const maxValue = 4096

// NewNormalizer returns the named normalizer. region is the default region
// of phone numbers (ISO 3166 code such as "BD"); aliases turns on the email
// provider rules.
func NewNormalizer(name, region string, aliases bool) (Normalizer, error) {
	if region != "" && name != NormPhone {
		return nil, fmt.Errorf("normalizer %s takes no region", name)
	}
	if aliases && name != NormEmail {
		return nil, fmt.Errorf("normalizer %s takes no aliases option", name)
	}
	switch name {
	case NormTrim:
		return guard(trim, true), nil
	case NormLower:
		return guard(func(s string) (string, error) { return fold(s), nil }, true), nil
	case NormEmail:
		return guard(func(s string) (string, error) { return email(s, aliases) }, false), nil
	case NormPhone:
		region = strings.ToUpper(region)
		if region == "" {
			return nil, errors.New("normalizer phone needs a default region, such as phone BD")
		}
		if phonenumbers.GetCountryCodeForRegion(region) == 0 {
			return nil, fmt.Errorf("normalizer phone: unknown region %q (an ISO 3166 code such as BD or US)", region)
		}
		return guard(func(s string) (string, error) { return phone(s, region) }, false), nil
	case NormPath:
		return guard(cleanPath, false), nil
	case NormCredentials:
		return guard(credentials, false), nil
	}
	return nil, fmt.Errorf("unknown normalizer %q (choose trim, lower, email, phone, path or credentials)", name)
}

// guard rejects oversized values, and invalid UTF-8 before any normalizer
// sees it: trim and lower repair it (each invalid run is one U+FFFD), the
// others refuse it, because the application may decode those bytes as
// something else (an overlong "%C0%AE" is "." to some old decoders).
func guard(f Normalizer, repair bool) Normalizer {
	return func(s string) (string, error) {
		if len(s) > maxValue {
			return "", fmt.Errorf("%w: %d bytes", ErrInvalid, len(s))
		}
		if !utf8.ValidString(s) {
			if !repair {
				return "", fmt.Errorf("%w: not UTF-8", ErrInvalid)
			}
			s = strings.ToValidUTF8(s, "\uFFFD")
		}
		return f(s)
	}
}

// trim drops leading and trailing white space and invisible format
// characters (zero-width spaces, byte-order marks).
func trim(s string) (string, error) {
	return strings.TrimFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r)
	}), nil
}

var folder = cases.Fold()

// fold maps compatibility forms to one (full-width "ＡＢＣ" is "ABC", the
// Kelvin sign is K) and folds case, so "Rakib", "RAKIB" and "ｒａｋｉｂ" are
// one key.
func fold(s string) string {
	return norm.NFKC.String(folder.String(norm.NFKC.String(s)))
}

// invisible reports whether r is a character a reader cannot see: a
// control or format character (NUL, soft hyphen, zero-width space and
// joiners, byte-order mark, bidi controls) or another default-ignorable
// one (variation selectors, Hangul fillers). Applications differ on whether
// they drop, keep or reject these, so a value that holds one is refused.
func invisible(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point)
}

// asciiDigits writes the decimal digits of every script (Bengali ০১২,
// Devanagari, Arabic-Indic, full-width…) as ASCII digits, the only ones the
// phone library reads.
func asciiDigits(s string) string {
	return strings.Map(func(r rune) rune {
		if d, ok := digitValue(r); ok {
			return '0' + d
		}
		return r
	}, s)
}

// digitValue is the value of a decimal digit of any script. Unicode encodes
// every script's digits as one run of ten, 0 to 9 in order, and never
// splits a run, so a rune's value is its distance from the start of its
// range in the Nd table, modulo ten (adjacent runs share a range).
func digitValue(r rune) (rune, bool) {
	if r < 0x80 {
		return r - '0', '0' <= r && r <= '9'
	}
	for _, rg := range unicode.Nd.R16 {
		if lo, hi := rune(rg.Lo), rune(rg.Hi); lo <= r && r <= hi {
			return (r - lo) % 10, true
		}
	}
	for _, rg := range unicode.Nd.R32 {
		if lo, hi := rune(rg.Lo), rune(rg.Hi); lo <= r && r <= hi {
			return (r - lo) % 10, true
		}
	}
	return 0, false
}

// phone reads a number in any common spelling and returns it in E.164:
// with region BD, "01712345678", "+8801712345678", "8801712345678",
// "+880 1712-345678" and "০১৭১২৩৪৫৬৭৮" are all "+8801712345678". A
// number with an invisible character inside is refused.
func phone(s, region string) (string, error) {
	s = strings.TrimFunc(s, unicode.IsSpace)
	if strings.ContainsFunc(s, invisible) {
		return "", fmt.Errorf("%w: invisible character in a phone number", ErrInvalid)
	}
	s = asciiDigits(norm.NFKC.String(s))
	num, err := phonenumbers.Parse(s, region)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !phonenumbers.IsValidNumber(num) {
		// A national number written with the country code but without
		// "+" parses as national in some regions: try it as international.
		if num2, err2 := phonenumbers.Parse("+"+strings.TrimLeft(s, "+"), region); err2 == nil && phonenumbers.IsValidNumber(num2) {
			num = num2
		} else {
			return "", fmt.Errorf("%w: not a valid phone number for region %s", ErrInvalid, region)
		}
	}
	return phonenumbers.Format(num, phonenumbers.E164), nil
}

// credentials reduces an Authorization-style value to "<scheme> <token>":
// the scheme is case-insensitive and the space before the token may be any
// run of spaces and tabs (RFC 9110), so "Bearer tok", "bearer  tok" and
// "BEARER\ttok" are one key, as the servers that accept them read them.
// The token itself is kept as sent: tokens are case-sensitive. A value
// with a control character, or with anything after the token, is refused.
func credentials(s string) (string, error) {
	s = strings.Trim(s, " \t")
	i := strings.IndexAny(s, " \t")
	if i < 0 {
		return "", fmt.Errorf("%w: no scheme and token", ErrInvalid)
	}
	scheme, token := s[:i], strings.TrimLeft(s[i:], " \t")
	if scheme == "" || token == "" || strings.ContainsAny(token, " \t") {
		return "", fmt.Errorf("%w: not one scheme and one token", ErrInvalid)
	}
	for _, r := range s {
		if (r < 0x20 && r != '\t') || r == 0x7f || unicode.Is(unicode.Cf, r) {
			return "", fmt.Errorf("%w: control or invisible character", ErrInvalid)
		}
	}
	return strings.ToLower(scheme) + " " + token, nil
}
