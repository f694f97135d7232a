package keys

import (
	"net/netip"
	"testing"
)

// couldBeIP never turns away an address netip reads (zoned ones aside,
// which are kept as they are anyway), so skipping ParseAddr for the values
// it turns away changes no key.
func FuzzCouldBeIP(f *testing.F) {
	for _, s := range []string{"192.0.2.7", "::ffff:192.0.2.7", "2001:DB8::1", "fe80::1%eth0", "alice", "cafe", "1.2.3", "", "::", "1:2:3:4:5:6:7:8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		addr, err := netip.ParseAddr(v)
		if err == nil && addr.Zone() == "" && !couldBeIP(v) {
			t.Fatalf("%q is an address, but couldBeIP turns it away", v)
		}
		if got, ok := canonicalIP(v, 0, 0); !couldBeIP(v) && (got != v || ok) {
			t.Fatalf("canonicalIP(%q) = %q, %v", v, got, ok)
		}
	})
}
