package integration

import (
	"fmt"
	"io"
	"net/http"
	"testing"
)

// A default port inside a longer number is not rewritten: an upstream on
// an ephemeral port such as 49081 stays where it is, and so does a port
// holding 9080 that withPorts already wrote (a config passes twice when a
// test builds it with jsonServer and loads it with newTester).
func TestWithPortsRewritesWholePortsOnly(t *testing.T) {
	defer func(p int) { httpPort = p }(httpPort)
	httpPort = 19080
	cfg := "{\n\thttp_port 9080\n}\n:9080 {\n\treverse_proxy 127.0.0.1:49081 127.0.0.1:39080\n}\n:9081 {\n}"
	want := "{\n\thttp_port 19080\n\tdefault_bind 127.0.0.1\n}\n:19080 {\n\treverse_proxy 127.0.0.1:49081 127.0.0.1:39080\n}\n:19081 {\n}"
	once := withPorts(cfg)
	if once != want {
		t.Fatalf("withPorts:\n%s\nwant:\n%s", once, want)
	}
	if twice := withPorts(once); twice != once {
		t.Fatalf("withPorts twice:\n%s\nwant:\n%s", twice, once)
	}
}

// Right after a reload, the admin API and the sites answer, from the new
// config: Caddy stops the old servers in the background, sharing the
// ports with the new ones meanwhile, and the helpers wait until they are
// gone. Without that, about one reload in 300 had its /load or its next
// site request reset, under the race detector: this failed one run in four.
func TestReloadThenAnswerAtOnce(t *testing.T) {
	newTester(t, jsonServer(okHandler, ""), "json")
	for i := range 100 {
		body := fmt.Sprintf("v%d", i)
		loadConfig(t, jsonServer(`{"handler": "static_response", "status_code": 200, "body": "`+body+`"}`, ""), "json")
		req, _ := http.NewRequest("GET", httpBase+"/", nil)
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("reload %d: the site: %v", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != body {
			t.Fatalf("reload %d: the site answered %q, want %q (the new config)", i, got, body)
		}
	}
}
