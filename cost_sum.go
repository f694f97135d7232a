package sluice

import (
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/keys"
)

// splitSum cuts a cost at the + signs outside placeholders: an estimate
// made of parts, such as the prompt's tokens plus max_tokens.
func splitSum(s string) []string {
	var parts []string
	depth, from := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			depth++
		case '}':
			depth = max(depth-1, 0)
		case '+':
			if depth == 0 {
				parts = append(parts, s[from:i])
				from = i + 1
			}
		}
	}
	return append(parts, s[from:])
}

// parseSum reads a cost written as a sum of numbers and placeholders.
func parseSum(s string, parts []string) (*Cost, error) {
	t, err := keys.ParseTemplate(s)
	if err != nil {
		return nil, fmt.Errorf("cost: %v", err)
	}
	c := &Cost{expr: s, tmpl: t}
	for _, p := range parts {
		term, err := ParseCost(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("cost %q: %v", s, err)
		}
		c.terms = append(c.terms, *term)
	}
	return c, nil
}

// evalSum adds the terms up, saturating. A placeholder that is absent
// adds 0; a sum whose terms are all absent placeholders costs 1, as one
// absent placeholder does. A term that cannot be read, or is not a whole
// number ≥ 0, makes the whole cost an error.
func (c *Cost) evalSum(r *http.Request, repl *caddy.Replacer, body *keys.Body) (int64, error) {
	var sum int64
	some := false
	for i := range c.terms {
		t := &c.terms[i]
		n := t.n
		if t.expr != "" {
			s, err := t.tmpl.Expand(r, repl, body)
			if err != nil {
				return 0, fmt.Errorf("cost %s cannot be read: %w", c.expr, err)
			}
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			if n, err = parseCostValue(s); err != nil {
				return 0, err
			}
		}
		some = true
		if sum > math.MaxInt64-n {
			sum = math.MaxInt64
		} else {
			sum += n
		}
	}
	if !some {
		return 1, nil
	}
	return sum, nil
}

// least is the least a sum can cost: its numbers, the placeholders adding
// at least 0 (saturating). 0 for a cost that is not a sum.
func (c *Cost) least() int64 {
	var sum int64
	for _, t := range c.terms {
		if t.expr == "" {
			sum = min(sum, math.MaxInt64-t.n) + t.n
		}
	}
	return sum
}
