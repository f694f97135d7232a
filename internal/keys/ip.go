// Package keys turns a request into rate-limit keys: placeholders expanded
// value by value, client addresses canonicalized and masked, identifiers
// normalized, body fields read, and sensitive keys hashed.
package keys

import (
	"fmt"
	"net/netip"
)

// canonicalIP returns the canonical form of v when it is an IP address:
// IPv4-mapped IPv6 as IPv4, IPv6 in lower-case shortest form, and masked to
// the network of v4 or v6 bits when that prefix is set (written as a CIDR,
// "192.0.2.0/24"). Other values, zoned addresses included, come back as
// they are, with ok false.
func canonicalIP(v string, v4, v6 int) (string, bool) {
	if !couldBeIP(v) {
		return v, false
	}
	addr, err := netip.ParseAddr(v)
	if err != nil || addr.Zone() != "" {
		return v, false
	}
	addr = addr.Unmap()
	bits := v6
	if addr.Is4() {
		bits = v4
	}
	if bits == 0 {
		// Most values are in canonical form already (Caddy's client_ip
		// is): they are kept, rather than written out again.
		var buf [len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255")]byte
		if b := addr.AppendTo(buf[:0]); string(b) != v {
			return string(b), true
		}
		return v, true
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return v, false
	}
	return p.String(), true
}

// couldBeIP reports whether v is made of the characters of an unzoned IP
// address, with a dot or a colon. Most values that are not addresses
// (names, tokens, emails) are told apart by it, without the error of
// netip.ParseAddr, which allocates.
func couldBeIP(v string) bool {
	sep := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '.' || c == ':':
			sep = true
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return sep
}

// ParseCIDRs reads addresses and networks ("192.0.2.0/24", "2001:db8::1")
// for allow and deny lists. IPv4-mapped IPv6 networks are stored as IPv4.
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			addr, aerr := netip.ParseAddr(s)
			if aerr != nil || addr.Zone() != "" {
				return nil, fmt.Errorf("%q is not an address or a network such as 192.0.2.0/24", s)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Contains reports whether ip (as Caddy's client_ip gives it) is in one of
// the networks.
func Contains(nets []netip.Prefix, ip string) bool {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	addr = addr.Unmap().WithZone("")
	for _, n := range nets {
		if n.Contains(addr) {
			return true
		}
	}
	return false
}
