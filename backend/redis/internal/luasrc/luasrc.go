// Package luasrc makes the Redis store's script from its parts: the files
// NN-<part>.lua of a directory, joined in name order, the first of them
// (00-protocol.lua) naming the protocol's constants, generated from
// backend/redis/protocol.go.
//
// The protocol's names are written as their values in the joined text.
// Redis runs Lua 5.1, which has no constants: a local that a function uses
// is an upvalue, captured anew each time the function is made, and a
// script's functions are made anew on every call. Some sixty named
// constants, used by the functions of every part, cost 40–50% more Redis
// CPU per single-decision call than the literals they name (measured),
// where Lua 5.4 would have compiled them as <const> locals, in place. So
// Join does that: the parts read with names, Redis runs literals. Every
// line stays where it is, so the line of a Redis error (user_script:N) is
// line N of the parts joined (cat lua/[0-9]*.lua).
package luasrc

import (
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
)

// ProtocolPart is the name of the first part, the generated protocol.
const ProtocolPart = "00-protocol.lua"

// part matches the name of a part: two digits, a dash, a name.
var part = regexp.MustCompile(`^[0-9][0-9]-[a-z0-9]+\.lua$`)

// Join returns the script made of the parts in the root of fsys, and the
// protocol they name.
func Join(fsys fs.FS) (string, Protocol, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return "", nil, err
	}
	var names []string
	for _, e := range entries {
		if part.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 || names[0] != ProtocolPart {
		return "", nil, fmt.Errorf("the script's first part must be %s, got %v", ProtocolPart, names)
	}
	var b strings.Builder
	var p Protocol
	for i, name := range names {
		text, err := fs.ReadFile(fsys, name)
		if err != nil {
			return "", nil, err
		}
		if i == 0 {
			var decls string
			if p, decls, err = ReadProtocol(string(text)); err != nil {
				return "", nil, fmt.Errorf("%s: %w", name, err)
			}
			b.WriteString(decls)
			continue
		}
		b.WriteString(p.Inline(string(text)))
	}
	return b.String(), p, nil
}

// Protocol maps each name of the protocol part to its value, a Lua
// literal.
type Protocol map[string]string

var decl = regexp.MustCompile(`^local ([A-Z][A-Z0-9_]*) = ("(?:[^"\\]|\\.)*"|-?[0-9]+)( --.*)?$`)

// ReadProtocol reads the protocol part: its names and values, and the
// part as it runs, each declaration a comment (its value is written where
// the name is used).
func ReadProtocol(text string) (Protocol, string, error) {
	p := make(Protocol)
	lines := strings.SplitAfter(text, "\n")
	for i, line := range lines {
		body := strings.TrimSuffix(line, "\n")
		if body == "" || strings.HasPrefix(body, "--") {
			continue
		}
		m := decl.FindStringSubmatch(body)
		if m == nil {
			return nil, "", fmt.Errorf("line %d is not a constant: %q", i+1, body)
		}
		p[m[1]] = m[2]
		lines[i] = "-- " + line
	}
	if len(p) == 0 {
		return nil, "", fmt.Errorf("no constants")
	}
	return p, strings.Join(lines, ""), nil
}

// Inline writes each name of p used in the Lua text as its value. Strings
// and comments are left as they are, and so is a name read as a field
// (t.NAME).
func (p Protocol) Inline(text string) string {
	return rewriteNames(text, func(w string) string {
		if v, ok := p[w]; ok {
			return v
		}
		return w
	})
}

// rewriteNames writes each name in the code of the Lua text as f returns
// it: not in strings or comments, nor a name read as a field (t.NAME).
func rewriteNames(text string, f func(string) string) string {
	var b strings.Builder
	b.Grow(len(text))
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '-' && strings.HasPrefix(text[i:], "--"):
			n := 2
			if l := longBracket(text[i+2:]); l > 0 {
				n += l
			} else if j := strings.IndexByte(text[i:], '\n'); j >= 0 {
				n = j
			} else {
				n = len(text) - i
			}
			b.WriteString(text[i : i+n])
			i += n
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(text) && text[j] != c && text[j] != '\n' {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(text))
			b.WriteString(text[i:j])
			i = j
		case c == '[' && longBracket(text[i:]) > 0:
			n := longBracket(text[i:])
			b.WriteString(text[i : i+n])
			i += n
		case isDigit(c):
			// A number, with its letters (1e9, 0x1F).
			j := i
			for j < len(text) && (isWord(text[j]) || text[j] == '.') {
				j++
			}
			b.WriteString(text[i:j])
			i = j
		case isWord(c):
			j := i
			for j < len(text) && isWord(text[j]) {
				j++
			}
			w := text[i:j]
			if i == 0 || text[i-1] != '.' {
				w = f(w)
			}
			b.WriteString(w)
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// longBracket returns the length of the long string or comment body that
// starts s ([[...]], [==[...]==]), through its closing bracket; 0 when s
// does not start one.
func longBracket(s string) int {
	if len(s) < 2 || s[0] != '[' {
		return 0
	}
	eq := 0
	for 1+eq < len(s) && s[1+eq] == '=' {
		eq++
	}
	if 1+eq >= len(s) || s[1+eq] != '[' {
		return 0
	}
	closing := "]" + strings.Repeat("=", eq) + "]"
	if j := strings.Index(s[2+eq:], closing); j >= 0 {
		return 2 + eq + j + len(closing)
	}
	return len(s)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isWord(c byte) bool {
	return c == '_' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
