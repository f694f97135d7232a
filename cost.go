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

	"github.com/sluicehq/sluice/keys"
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
	if err := keys.CheckTemplate(t); err != nil {
		return nil, fmt.Errorf("cost: %v", err)
	}
	return &Cost{expr: s, tmpl: t}, nil
}

func (c *Cost) validate() error {
	if c.expr == "" && c.n < 0 {
		return fmt.Errorf("cost must be at least 0, got %d", c.n)
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

var (
	_ json.Marshaler   = Cost{}
	_ json.Unmarshaler = (*Cost)(nil)
)
