package keys

import "testing"

// The cases of mholt/caddy-ratelimit's network-prefix behaviour, which
// Sluice keeps for configs written for it.
func TestApplyPrefix(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		v4, v6 int
		want   string
	}{
		{"v6 /64", "2001:db8:1234:5678:9abc:def0:1234:5678", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /64 all ones", "2001:db8:1234:5678:ffff:ffff:ffff:ffff", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /64 short form", "2001:db8:1234:5678::1", 0, 64, "2001:db8:1234:5678::/64"},
		{"v6 /48", "2001:db8:1234:5678::1", 0, 48, "2001:db8:1234::/48"},
		{"v6 /128", "2001:db8:1234:5678::1", 0, 128, "2001:db8:1234:5678::1/128"},
		{"v4 /24", "192.168.1.100", 24, 0, "192.168.1.0/24"},
		{"v4 /8", "10.0.0.50", 8, 0, "10.0.0.0/8"},
		{"v4 /32", "172.16.5.4", 32, 0, "172.16.5.4/32"},
		{"v6 key uses v6 prefix", "2001:db8::1", 24, 64, "2001:db8::/64"},
		{"v4 key uses v4 prefix", "192.168.1.100", 24, 64, "192.168.1.0/24"},
		{"v4 prefix off", "192.168.1.100", 0, 64, "192.168.1.100"},
		{"v6 prefix off", "2001:db8::1", 24, 0, "2001:db8::1"},
		{"both off", "2001:db8::1", 0, 0, "2001:db8::1"},
		{"mapped v4 counts as v4", "::ffff:192.168.1.100", 24, 64, "192.168.1.0/24"},
		{"not an ip", "static", 0, 64, "static"},
		{"placeholder left over", "{http.request.uri}", 0, 64, "{http.request.uri}"},
		{"empty", "", 24, 64, ""},
		{"ip with port", "192.168.1.100:80", 24, 64, "192.168.1.100:80"},
		{"zoned v6", "fe80::1%eth0", 24, 64, "fe80::1%eth0"},
		{"composite key untouched", "login:192.168.1.100", 24, 64, "login:192.168.1.100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ApplyPrefix(tt.key, tt.v4, tt.v6); got != tt.want {
				t.Errorf("ApplyPrefix(%q, %d, %d) = %q, want %q", tt.key, tt.v4, tt.v6, got, tt.want)
			}
		})
	}
}
