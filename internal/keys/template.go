package keys

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Template is a key as configured: literal text and placeholders, split
// once at provision so that each placeholder's value can be processed on
// its own (an IP masked to its network, an identifier normalized) before
// the key is assembled.
type Template struct {
	raw   string
	parts []part
}

type part struct {
	text        string // literal text, or the placeholder's name
	placeholder bool
}

// ParseTemplate splits s as Caddy's replacer reads it: {name} is a
// placeholder, \{ and \} are literal braces, and a { without a closing }
// is literal text.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}'):
			lit.WriteByte(s[i+1])
			i++
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				lit.WriteString(s[i:])
				i = len(s)
				continue
			}
			name := s[i+1 : i+1+end]
			if name == "" {
				return Template{}, fmt.Errorf("empty placeholder {} in key %q", s)
			}
			if err := checkBodyPlaceholder(name); err != nil {
				return Template{}, err
			}
			flush()
			t.parts = append(t.parts, part{text: name, placeholder: true})
			i += end + 1
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return t, nil
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// Placeholders returns the names of the template's placeholders.
func (t Template) Placeholders() []string {
	var names []string
	for _, p := range t.parts {
		if p.placeholder {
			names = append(names, p.text)
		}
	}
	return names
}

// NeedsBody reports whether the template reads fields of the request body,
// or its size.
func (t Template) NeedsBody() bool {
	for _, p := range t.parts {
		if _, _, ok := bodyPlaceholder(p.text); p.placeholder && (ok || p.text == BodySize) {
			return true
		}
	}
	return false
}

// Expand returns the template with each placeholder replaced by its value
// as it is (body fields read from body, which may be nil when the template
// does not read the body). A value that is absent is empty; one that the
// request gives twice (ErrAmbiguous) or that cannot be read
// (ErrUnreadable) is an error, so that a caller never takes it for absent.
func (t Template) Expand(r *http.Request, repl *caddy.Replacer, body *Body) (string, error) {
	var sb strings.Builder
	for _, p := range t.parts {
		if !p.placeholder {
			sb.WriteString(p.text)
			continue
		}
		v, err := lookup(r, repl, body, p.text)
		if err != nil && !errors.Is(err, ErrAbsent) {
			return "", fmt.Errorf("{%s}: %w", p.text, err)
		}
		sb.WriteString(v)
	}
	return sb.String(), nil
}
