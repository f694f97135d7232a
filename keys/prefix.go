// Package keys turns a request into rate-limit keys.
package keys

import "net/netip"

// ApplyPrefix masks key to its network when the whole key is an IP address,
// as mholt/caddy-ratelimit's ipv4_prefix and ipv6_prefix do: an IPv4 address
// (IPv4-mapped IPv6 included) is masked to v4 bits, an IPv6 address to v6
// bits, and the result is written as a CIDR ("192.168.1.0/24"). A prefix of 0
// leaves that family's keys as they are, and so does any key that is not a
// plain IP address (zoned addresses included).
func ApplyPrefix(key string, v4, v6 int) string {
	if v4 == 0 && v6 == 0 {
		return key
	}
	addr, err := netip.ParseAddr(key)
	if err != nil || addr.Zone() != "" {
		return key
	}
	addr = addr.Unmap()
	bits := v6
	if addr.Is4() {
		bits = v4
	}
	if bits == 0 {
		return key
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}
