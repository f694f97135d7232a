package keys

import (
	"fmt"
	"strings"
)

// FromValues builds the key that a request whose placeholders had these
// values gets: one value per placeholder, in the template's order, each
// made canonical (IP addresses, masked to the prefix) and normalized as a
// request's value is, then the whole key hashed as the zone hashes it. An
// operator names a client this way (an email, an address) without knowing
// the key's final form. A value the zone would refuse is an error.
func (k *Keyer) FromValues(values []string) (string, error) {
	if n := len(k.tmpl.Placeholders()); n != len(values) {
		return "", fmt.Errorf("the key %s takes %d values, got %d", k.tmpl, n, len(values))
	}
	var sb strings.Builder
	i := 0
	for _, p := range k.tmpl.parts {
		if !p.placeholder {
			sb.WriteString(p.text)
			continue
		}
		v, err := k.transform(values[i])
		if err != nil {
			return "", fmt.Errorf("{%s}: %w", p.text, err)
		}
		sb.WriteString(v)
		i++
	}
	return k.final(sb.String()), nil
}
