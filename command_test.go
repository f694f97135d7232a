package sluice

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

// Every zone and key makes a path that no client or mux resolves away, and
// that unescapes back to the zone and the key.
func TestKeyPathSurvivesCleaning(t *testing.T) {
	for _, name := range []string{".", "..", "...", "a/..", "../a", "a b", "%", "ü", "x/../victim"} {
		p := "/rate_limit/" + keyPath(name, name)
		u, err := url.Parse("http://localhost" + p)
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if clean := path.Clean(u.EscapedPath()); clean != u.EscapedPath() {
			t.Errorf("%q: path %q is cleaned to %q", name, u.EscapedPath(), clean)
		}
		parts := strings.Split(strings.TrimPrefix(u.EscapedPath(), "/rate_limit/"), "/")
		if len(parts) != 4 {
			t.Fatalf("%q: %d segments in %q", name, len(parts), p)
		}
		for _, i := range []int{1, 3} {
			if s, err := url.PathUnescape(parts[i]); err != nil || s != name {
				t.Errorf("%q: segment %q unescapes to %q, %v", name, parts[i], s, err)
			}
		}
	}
}
