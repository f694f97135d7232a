package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/internal/keys"
)

// Cost is the units one request consumes: a whole number, or a placeholder
// that expands to one. In JSON it is a number or a string.
type Cost struct {
	n    int64
	expr string
	tmpl keys.Template
	// terms are the parts of a sum ("{http.request.body.json.max_tokens}
	// + 1000"), each a number or a placeholder; nil for a single one.
	terms []Cost
}

// ParseCost reads a cost as written in a Caddyfile: a whole number, or text
// holding placeholders.
func ParseCost(s string) (*Cost, error) {
	if parts := splitSum(s); len(parts) > 1 {
		return parseSum(s, parts)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		c := &Cost{n: n}
		return c, c.validate()
	}
	if !strings.Contains(s, "{") {
		return nil, fmt.Errorf("cost must be a whole number or a placeholder, got %q", s)
	}
	t, err := keys.ParseTemplate(s)
	if err != nil {
		return nil, fmt.Errorf("cost: %v", err)
	}
	// Braces that make no placeholder ("{", "}{", "{{}}") would read as
	// text: no request could ever have a cost.
	names := t.Placeholders()
	if len(names) == 0 || slices.ContainsFunc(names, func(n string) bool { return strings.ContainsAny(n, "{}") }) {
		return nil, fmt.Errorf("cost must be a whole number or a placeholder such as {http.request.header.X-Cost}, got %q", s)
	}
	// {name:default} reads as Caddy's default syntax, which its replacer
	// does not have at run time: it would be the placeholder (or JSON key)
	// "name:default", absent from every request, and silently cost 0.
	if i := slices.IndexFunc(names, func(n string) bool { return strings.Contains(n, ":") }); i >= 0 {
		return nil, fmt.Errorf("cost: placeholder {%s} has no default syntax (Caddy's replacer has none at run time; a field absent from the request adds 0 to a sum): for a least cost, write cost <expr> min <n>", names[i])
	}
	if err := keys.CheckTemplate(t); err != nil {
		return nil, fmt.Errorf("cost: %v", err)
	}
	return &Cost{expr: s, tmpl: t}, nil
}

func (c *Cost) validate() error {
	if c.expr == "" && c.n < 0 {
		return optionErrorf("cost", "cost must be at least 0, got %d", c.n)
	}
	return nil
}

// MarshalJSON writes a constant cost as a number and a placeholder as a
// string.
func (c Cost) MarshalJSON() ([]byte, error) {
	if c.expr != "" {
		return json.Marshal(c.expr)
	}
	return json.Marshal(c.n)
}

// UnmarshalJSON reads a number or a string.
func (c *Cost) UnmarshalJSON(b []byte) error {
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		*c = Cost{n: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("cost must be a whole number or a string with placeholders")
	}
	p, err := ParseCost(s)
	if err != nil {
		return err
	}
	*c = *p
	return nil
}

// needsBody reports whether the cost reads a field of the request body.
func (c *Cost) needsBody() bool { return c != nil && c.tmpl.NeedsBody() }

// eval returns the cost of the request r behind repl (and body, for body
// fields). A placeholder that is absent (a header not sent, a field absent
// from a readable body) costs 1. One that the request gives twice or whose
// body cannot be read is an error, never a cost of 1: a client must not
// pay 1 for a request the application reads as 1000. A number too large
// for 64 bits is the largest cost, which no limit holds.
func (c *Cost) eval(r *http.Request, repl *caddy.Replacer, body *keys.Body) (int64, error) {
	if c == nil {
		return 1, nil
	}
	if c.expr == "" {
		return c.n, nil
	}
	if c.terms != nil {
		return c.evalSum(r, repl, body)
	}
	s, err := c.tmpl.Expand(r, repl, body)
	if err != nil {
		return 0, fmt.Errorf("cost %s cannot be read: %w", c.expr, err)
	}
	if s = strings.TrimSpace(s); s == "" {
		return 1, nil
	}
	return parseCostValue(s)
}

// parseCostValue reads an expanded cost: a whole number ≥ 0, or the
// largest cost for one too large for 64 bits.
func parseCostValue(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(s, "-"):
		return math.MaxInt64, nil
	case err != nil || n < 0:
		return 0, fmt.Errorf("cost %q is not a whole number ≥ 0", s)
	}
	return n, nil
}

// costOption reads `cost <n>|<placeholder> [min <n>]`.
func (p *limitParser) costOption() error {
	d, l := p.d, p.l
	if !d.NextArg() {
		return d.ArgErr()
	}
	c, err := ParseCost(d.Val())
	if err != nil {
		return d.Errf("%s: %v", p.where, err)
	}
	l.Cost = c
	if !d.NextArg() {
		return nil
	}
	if d.Val() != "min" {
		return d.Errf("%scost: after the cost only min <n> may follow, got %q", where(p.where), d.Val())
	}
	if !d.NextArg() {
		return d.Errf("%scost: min needs a whole number", where(p.where))
	}
	n, err := strconv.ParseInt(d.Val(), 10, 64)
	if err != nil || n < 1 {
		return d.Errf("%scost: min must be a whole number ≥ 1, got %q", where(p.where), d.Val())
	}
	if d.NextArg() {
		return d.Errf("%scost: nothing may follow min %d, got %q", where(p.where), n, d.Val())
	}
	l.CostMin = n
	return nil
}

// checkCostMin validates cost_min against the cost and what the limit of
// algorithm alg holds.
func (l *Limit) checkCostMin(alg string) error {
	switch n := l.CostMin; {
	case n == 0:
		return nil
	case n < 0:
		return optionErrorf("cost_min", "cost_min must be at least 1, got %d", n)
	case l.Cost == nil || l.Cost.expr == "":
		return optionErrorf("cost_min", "cost_min applies to a cost read from the request (a placeholder, or a sum with one): a constant cost is what every request takes")
	case alg == "":
		return optionErrorf("cost_min", "cost_min needs a rate (rate <n>/<window>)")
	}
	if most := algorithms.MaxCost(alg, l.policy()); l.CostMin > most {
		return optionErrorf("cost_min", "cost_min %d can never pass: the limit holds at most %d units (raise %s)", l.CostMin, most, burstOrMax(alg, l.MaxDelay))
	}
	return nil
}

var (
	_ json.Marshaler   = Cost{}
	_ json.Unmarshaler = (*Cost)(nil)
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
