package keys

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nyaruka/phonenumbers"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// A Normalizer turns the spellings of one identifier into one key, so that
// an attacker cannot split a limit by writing the same phone number, email
// or path differently (seed part 10.5). An error means the value is not a
// valid identifier of its kind; the zone's missing-key policy applies.
type Normalizer func(string) (string, error)

// Normalizer names, as written in the `normalize` option.
const (
	NormTrim  = "trim"
	NormLower = "lower"
	NormEmail = "email"
	NormPhone = "phone"
	NormPath  = "path"
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
		return guard(trim), nil
	case NormLower:
		return guard(func(s string) (string, error) { return fold(s), nil }), nil
	case NormEmail:
		return guard(func(s string) (string, error) { return email(s, aliases) }), nil
	case NormPhone:
		region = strings.ToUpper(region)
		if region == "" {
			return nil, errors.New("normalizer phone needs a default region, such as phone BD")
		}
		if phonenumbers.GetCountryCodeForRegion(region) == 0 {
			return nil, fmt.Errorf("normalizer phone: unknown region %q (an ISO 3166 code such as BD or US)", region)
		}
		return guard(func(s string) (string, error) { return phone(s, region) }), nil
	case NormPath:
		return guard(cleanPath), nil
	}
	return nil, fmt.Errorf("unknown normalizer %q (choose trim, lower, email, phone or path)", name)
}

// guard rejects oversized values and repairs invalid UTF-8 before any
// normalizer sees them.
func guard(f Normalizer) Normalizer {
	return func(s string) (string, error) {
		if len(s) > maxValue {
			return "", fmt.Errorf("%w: %d bytes", ErrInvalid, len(s))
		}
		if !utf8.ValidString(s) {
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

// email reads an address: trimmed, case folded, and with aliases the
// provider rules: a "+tag" is dropped from the local part, and for Gmail the
// dots too (r.a.kib+x@gmail.com is rakib@gmail.com).
func email(s string, aliases bool) (string, error) {
	s, _ = trim(s)
	s = fold(s)
	at := strings.LastIndexByte(s, '@')
	if at <= 0 || at == len(s)-1 {
		return "", fmt.Errorf("%w: not an email address", ErrInvalid)
	}
	local, domain := s[:at], strings.TrimSuffix(s[at+1:], ".")
	if strings.ContainsFunc(s, unicode.IsSpace) || strings.ContainsRune(domain, '@') || !strings.Contains(domain, ".") {
		return "", fmt.Errorf("%w: not an email address", ErrInvalid)
	}
	if aliases {
		if plus := strings.IndexByte(local, '+'); plus >= 0 {
			local = local[:plus]
		}
		if domain == "googlemail.com" {
			domain = "gmail.com"
		}
		if domain == "gmail.com" {
			local = strings.ReplaceAll(local, ".", "")
		}
		if local == "" {
			return "", fmt.Errorf("%w: empty local part", ErrInvalid)
		}
	}
	return local + "@" + domain, nil
}

// phone reads a number in any common spelling and returns it in E.164:
// with region BD, "01712345678", "+8801712345678", "8801712345678" and
// "+880 1712-345678" are all "+8801712345678".
func phone(s, region string) (string, error) {
	s, _ = trim(s)
	s = norm.NFKC.String(s) // full-width digits
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

// cleanPath makes one key of a path's spellings: percent-decoded, case and
// compatibility forms folded, repeated and dot segments resolved, no
// trailing slash ("/API//v1/./x/" and "/api/v1/%78" are "/api/v1/x"). It
// decodes until nothing changes, so a double-encoded path is merged with
// its plain form too: for a limiter, merging spellings is the safe side.
func cleanPath(s string) (string, error) {
	for i := 0; ; i++ {
		if i == 8 {
			return "", fmt.Errorf("%w: path encoded too many times", ErrInvalid)
		}
		prev := s
		if j := strings.IndexAny(s, "?#"); j >= 0 {
			s = s[:j]
		}
		if dec, err := url.PathUnescape(s); err == nil {
			s = dec
		}
		s = fold(strings.ToValidUTF8(s, "\uFFFD"))
		if s == prev {
			break
		}
	}
	if !strings.HasPrefix(s, "/") {
		s = "/" + s
	}
	return path.Clean(s), nil
}
