package keys

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// email reads one address the way a mail server reads a recipient and
// returns the mailbox it delivers to, as local@domain:
//
//   - comments are dropped wherever RFC 5322 allows them, nested or not
//     ("rakib(x)@gmail.com", "rakib@(x)gmail.com"), and so is the white
//     space around the parts ("rakib @ gmail.com");
//   - a display name and angle brackets are dropped ("Rakib
//     <rakib@gmail.com>", "<rakib@gmail.com>");
//   - a quoted local part is unquoted ("\"rakib\"@gmail.com"); one that is
//     not a plain dot-atom once unquoted ("\"ra kib\"@", "\"a@b\"@") is
//     refused, since few providers accept such mailboxes and a key for it
//     would need a second canonical spelling;
//   - the local part's case and compatibility forms are folded;
//   - the domain is written in ASCII (IDNA UTS #46 lookup: "exämple.com"
//     is "xn--exmple-cua.com"), lower case, without a trailing dot.
//
// Refused: invisible characters anywhere (NUL, soft hyphen, zero-width
// space, byte-order mark, bidi controls), "@" more than once outside
// quotes, lists, groups, source routes and domain literals ("[192.0.2.1]"),
// domains of one label or with a numeric top label, and domains with "ß"
// or final sigma, which the two IDNA standards send to different domains.
//
// With aliases, the provider rules: a "+tag" is dropped from the local
// part, and for Gmail the dots too (r.a.kib+x@gmail.com is
// rakib@gmail.com).
func email(s string, aliases bool) (string, error) {
	s = strings.TrimFunc(s, unicode.IsSpace)
	if strings.ContainsFunc(s, invisible) {
		return "", fmt.Errorf("%w: invisible character in an email address", ErrInvalid)
	}
	var buf [24]mailToken
	toks, err := mailTokens(s, buf[:0])
	if err != nil {
		return "", err
	}
	toks, err = addrSpec(toks)
	if err != nil {
		return "", err
	}
	at := -1
	for i, t := range toks {
		if t.kind == '@' {
			if at >= 0 {
				return "", fmt.Errorf("%w: more than one @ in an email address", ErrInvalid)
			}
			at = i
		}
	}
	if at < 0 {
		return "", fmt.Errorf("%w: not an email address", ErrInvalid)
	}
	local, err := mailLocal(toks[:at])
	if err != nil {
		return "", err
	}
	domain, err := mailDomain(toks[at+1:])
	if err != nil {
		return "", err
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
		if !dotAtom(local) {
			return "", fmt.Errorf("%w: no mailbox left without the +tag", ErrInvalid)
		}
	}
	return local + "@" + domain, nil
}

// A mailToken is a word of an address: an atom ('a'), the text of a quoted
// string ('q'), or one of the specials '.', '@', '<' and '>'.
type mailToken struct {
	kind byte
	text string
}

// mailTokens splits an address into tokens, dropping white space and
// comments. Specials that only lists, groups, routes and domain literals
// use (",", ":", ";", "[", "]") and stray "\\" or ")" are refused.
func mailTokens(s string, toks []mailToken) ([]mailToken, error) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case unicode.IsSpace(r):
			i += size
		case r == '(':
			n, err := mailComment(s[i:])
			if err != nil {
				return nil, err
			}
			i += n
		case r == '"':
			text, n, err := mailQuoted(s[i:])
			if err != nil {
				return nil, err
			}
			toks = append(toks, mailToken{'q', text})
			i += n
		case r == '.' || r == '@' || r == '<' || r == '>':
			toks = append(toks, mailToken{kind: byte(r)})
			i++
		case atext(r):
			j := i + size
			for j < len(s) {
				r, size := utf8.DecodeRuneInString(s[j:])
				if !atext(r) {
					break
				}
				j += size
			}
			toks = append(toks, mailToken{'a', s[i:j]})
			i = j
		default:
			return nil, fmt.Errorf("%w: %q in an email address", ErrInvalid, r)
		}
	}
	return toks, nil
}

// atext reports whether r may appear in an atom (RFC 5322, with RFC 6532's
// non-ASCII characters).
func atext(r rune) bool {
	switch {
	case r >= utf8.RuneSelf:
		return true
	case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-/=?^_`{|}~", r)
}

// mailComment returns the length of the comment that s starts with, nested
// comments and quoted pairs included.
func mailComment(s string) (int, error) {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++ // the next byte is quoted; a multi-byte rune's tail bytes are never specials
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: unclosed comment in an email address", ErrInvalid)
}

// mailQuoted returns the text of the quoted string that s starts with,
// quoted pairs unescaped, and its length.
func mailQuoted(s string) (string, int, error) {
	var sb strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return sb.String(), i + 1, nil
		case '\\':
			if i+1 < len(s) {
				i++
				sb.WriteByte(s[i])
			}
		default:
			sb.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("%w: unclosed quote in an email address", ErrInvalid)
}

// addrSpec strips a display name and angle brackets, which wrap the
// address when they are there: only words and dots may come before "<",
// nothing after ">".
func addrSpec(toks []mailToken) ([]mailToken, error) {
	open := -1
	for i, t := range toks {
		if t.kind == '<' {
			open = i
			break
		}
	}
	if open < 0 {
		for _, t := range toks {
			if t.kind == '>' {
				return nil, fmt.Errorf("%w: unbalanced > in an email address", ErrInvalid)
			}
		}
		return toks, nil
	}
	for _, t := range toks[:open] {
		if t.kind != 'a' && t.kind != 'q' && t.kind != '.' {
			return nil, fmt.Errorf("%w: display name with %c", ErrInvalid, t.kind)
		}
	}
	toks = toks[open+1:]
	if len(toks) == 0 || toks[len(toks)-1].kind != '>' {
		return nil, fmt.Errorf("%w: unclosed < in an email address", ErrInvalid)
	}
	toks = toks[:len(toks)-1]
	for _, t := range toks {
		if t.kind == '<' || t.kind == '>' {
			return nil, fmt.Errorf("%w: nested angle brackets in an email address", ErrInvalid)
		}
	}
	return toks, nil
}

// dotWords joins words separated by single dots ("a.b", "\"a\".b"). Two
// words in a row (they were separated by white space or a comment), a
// leading, trailing or doubled dot, a quoted word where quotes is false,
// and anything else are refused. A single trailing dot is allowed when
// trailingDot is set, and dropped.
func dotWords(toks []mailToken, quotes, trailingDot bool) (string, bool) {
	if trailingDot && len(toks) > 1 && toks[len(toks)-1].kind == '.' {
		toks = toks[:len(toks)-1]
	}
	if len(toks)%2 == 0 {
		return "", false
	}
	var sb strings.Builder
	for i, t := range toks {
		switch {
		case i%2 == 1 && t.kind == '.':
			sb.WriteByte('.')
		case i%2 == 0 && (t.kind == 'a' || t.kind == 'q' && quotes):
			sb.WriteString(t.text)
		default:
			return "", false
		}
	}
	return sb.String(), true
}

// mailLocal returns the local part, unquoted and folded. It must be a
// dot-atom once unquoted ("\"r.a\".kib" is r.a.kib) and stay one once
// folded (a full-width "＠" folds to "@").
func mailLocal(toks []mailToken) (string, error) {
	local, ok := dotWords(toks, true, false)
	if ok && dotAtom(local) {
		local = fold(local)
		if dotAtom(local) && len(local) <= 64 {
			return local, nil
		}
	}
	return "", fmt.Errorf("%w: local part is not a plain mailbox name", ErrInvalid)
}

// dotAtom reports whether s is atoms separated by single dots.
func dotAtom(s string) bool {
	if s == "" {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || strings.ContainsFunc(part, func(r rune) bool { return !atext(r) }) {
			return false
		}
	}
	return true
}

// mailDomain returns the domain in ASCII: IDNA lookup processing maps case
// and compatibility forms and encodes U-labels as A-labels; an A-label is
// decoded and encoded again, so that it is kept only in the one spelling
// its U-label encodes to.
func mailDomain(toks []mailToken) (string, error) {
	d, ok := dotWords(toks, false, true)
	if !ok {
		return "", fmt.Errorf("%w: domain is not a host name", ErrInvalid)
	}
	a, err := idna.Lookup.ToASCII(d)
	if err != nil {
		return "", fmt.Errorf("%w: domain: %v", ErrInvalid, err)
	}
	a = strings.TrimSuffix(a, ".") // a full-width trailing dot is one only now
	u, err := idna.Lookup.ToUnicode(a)
	if err != nil {
		return "", fmt.Errorf("%w: domain: %v", ErrInvalid, err)
	}
	if strings.ContainsAny(u, "ßς") {
		return "", fmt.Errorf("%w: domain %q means one host under IDNA 2003 and another under IDNA 2008", ErrInvalid, u)
	}
	if again, err := idna.Lookup.ToASCII(u); err != nil || again != a {
		return "", fmt.Errorf("%w: domain %q is not in its canonical IDNA form", ErrInvalid, a)
	}
	if len(a) > 253 {
		return "", fmt.Errorf("%w: domain longer than 253 bytes", ErrInvalid)
	}
	labels := strings.Split(a, ".")
	if len(labels) < 2 {
		return "", fmt.Errorf("%w: domain %q has one label", ErrInvalid, a)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("%w: domain %q has an empty or overlong label", ErrInvalid, a)
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("%w: domain %q ends in a numeric label", ErrInvalid, a)
	}
	return a, nil
}
