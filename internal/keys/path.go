package keys

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxDecodes is how many layers of percent-encoding cleanPath peels off;
// a path encoded more often than this is refused.
const maxDecodes = 8

// cleanPath makes one key of the spellings of a path that upstreams serve
// as one: "/API//v1/./x/", "/api/v1/%78", "/api;v=2/v1/x" and
// "/p1%3F/../api/v1/x" are all "/api/v1/x". The value is a path, as
// {http.request.uri.path} gives it: "?" and "#" in it are characters of a
// segment, never the start of a query, because that placeholder has
// already decoded "%3F" and "%23" to them, and Caddy and the upstream
// resolve "/p1%3F/../x" to "/x".
//
// In order: %XX escapes are decoded, and case and compatibility forms
// folded, until nothing changes (a double-encoded "%252F" is "/": for a
// limiter, merging spellings is the safe side); each segment loses its
// ";params" (servlet containers drop them, so "/x/..;/y" is "/y"); empty
// and "." segments go, ".." removes the segment before it. Refused: bytes
// that are not UTF-8 once decoded (overlong forms such as "%C0%AF"), control
// and invisible characters, backslashes (a separator on Windows servers),
// and a segment ending in a dot or a space, which Windows servers drop
// ("/login." and "/login%20" are "/login" to IIS).
func cleanPath(s string) (string, error) {
	for i := 0; ; i++ {
		if i == maxDecodes {
			return "", fmt.Errorf("%w: path encoded too many times", ErrInvalid)
		}
		dec := unescapePath(s)
		if !utf8.ValidString(dec) {
			return "", fmt.Errorf("%w: path is not UTF-8 once decoded", ErrInvalid)
		}
		dec = fold(dec)
		if dec == s {
			break
		}
		s = dec
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r == '\\' || invisible(r) }) {
		return "", fmt.Errorf("%w: control character, invisible character or backslash in a path", ErrInvalid)
	}
	out := make([]string, 0, strings.Count(s, "/")+1)
	for seg := range strings.SplitSeq(s, "/") {
		seg, _, _ = strings.Cut(seg, ";")
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			continue
		}
		if last, _ := utf8.DecodeLastRuneInString(seg); last == '.' || unicode.IsSpace(last) {
			return "", fmt.Errorf("%w: path segment %q ends in a dot or a space", ErrInvalid, seg)
		}
		out = append(out, seg)
	}
	return "/" + strings.Join(out, "/"), nil
}

// unescapePath decodes the valid %XX escapes of s and keeps every other
// byte, a "%" without two hex digits included, as it is: one bad escape
// must not leave the rest of the path undecoded.
func unescapePath(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && unhex(s[i+1]) >= 0 && unhex(s[i+2]) >= 0 {
			b = append(b, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

// unhex is the value of hex digit c, or -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
