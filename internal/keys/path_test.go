package keys

import (
	"errors"
	"strings"
	"testing"
)

// Spellings that Caddy's path matcher, and one upstream family or another,
// route to the same handler are one key.
func TestPathOneRoute(t *testing.T) {
	n := mustNorm(t, NormPath, "", false)
	tests := []struct {
		name      string
		spellings []string
		want      string
	}{
		{"dot segments, never cut at a decoded ? or #", []string{
			"/api/login", "/x/../api/login", "/p1%3F/../api/login", "/p1?/../api/login", "/p1%23/../api/login",
			"/p1#/../api/login", "/p1%3f%23/../api/login", "/api/./login", "/api/%2e/login", "/x/%2E%2e/api/login",
			"/../api/login", "/a/b/../../api/login",
		}, "/api/login"},
		{";params dropped from each segment", []string{
			"/api;x/login", "/api/login;a", "/api/login;jsessionid=1", "/api/x/..;/login", "/api;/login;", "/;x/api/login",
			"/api/login%3Bx", "/api%3B/login",
		}, "/api/login"},
		{"case, slashes, trailing slash, encodings", []string{
			"/API/Login", "/api//login", "/api/login/", "api/login", "/api/%6Cogin", "/api/%6cogin", "/api%2Flogin",
			"/api%2flogin", "/api%252Flogin", "/api/%25%36%43ogin", "/ＡＰＩ/ｌｏｇｉｎ", "/api／login", "/api/login%2F",
		}, "/api/login"},
		{"root", []string{"/", "", "/.", "/..", "/../..", "//", "/;x", "/%2e%2e/"}, "/"},
		{"a literal ? stays in its segment", []string{"/files/what%3F", "/files/what?", "/files/WHAT%3f/"}, "/files/what?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, s := range tt.spellings {
				if got, err := n(s); err != nil || got != tt.want {
					t.Errorf("%q → %q, %v; want %q", s, got, err, tt.want)
				}
			}
		})
	}
}

// Spellings that some upstream reads as another path, and bytes no path
// should hold, are refused.
func TestPathRefused(t *testing.T) {
	n := mustNorm(t, NormPath, "", false)
	tests := []struct {
		name   string
		inputs []string
	}{
		{"NUL and control characters", []string{
			"/login%00", "/login\x00", "/lo%0Agin", "/login\r", "/login%0d%0a", "/login%7F", "/login%C2%85", "/log%09in",
		}},
		{"invisible characters", []string{
			"/login\u200b", "/log\u00adin", "/login%E2%80%8B", "/api/login\ufeff", "/%E2%80%AElogin", "/login%EF%B8%8F",
		}},
		{"backslashes", []string{"/api\\login", "/api%5Clogin", "/api%5clogin", "/api%255Clogin", "/api＼login", "\\api\\login"}},
		{"trailing dots and spaces", []string{
			"/login.", "/login..", "/login...", "/login%2E", "/login%2e%2e%2e", "/login%20", "/login ", "/login%20/",
			"/login.%2F", "/login%C2%A0", "/login%E3%80%80", "/api./login", "/api%20/login", "/login.;x", "/login%20;x",
			"/....", "/. /login", "/login%252E",
		}},
		{"bytes that are not UTF-8 once decoded", []string{
			"/%C0%AF", "/%C0%AE%C0%AE/login", "/\xc0\xae\xc0\xae/login", "/a\xff", "/%E0%80%AF", "/%ED%A0%80", "/%FF", "/login%C0", "/%F0%80%80%AF",
		}},
		{"encoded too many times", []string{"/%" + strings.Repeat("25", maxDecodes) + "41"}},
		{"too long", []string{"/" + strings.Repeat("a", maxValue)}},
	}
	for _, tt := range tests {
		for _, in := range tt.inputs {
			if got, err := n(in); err == nil {
				t.Errorf("%s: %q accepted as %q", tt.name, in, got)
			} else if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: %q: error %v does not wrap ErrInvalid", tt.name, in, err)
			}
		}
	}
	// Seven layers of encoding are still read.
	if got, err := n("/%" + strings.Repeat("25", maxDecodes-2) + "41"); err != nil || got != "/a" {
		t.Errorf("seven layers: %q, %v", got, err)
	}
}
