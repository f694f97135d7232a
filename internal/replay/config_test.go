package replay

import (
	"encoding/json"
	"strings"
	"testing"
)

func jsonConfig(zones string, server string) []byte {
	return []byte(`{"apps": {"http": {"servers": {"srv0": {"listen": [":443"], ` + server + `"routes": [
		{"match": [{"host": ["example.com"]}], "handle": [{"handler": "subroute", "routes": [
			{"handle": [{"handler": "rate_limit", "backend": {"name": "redis", "address": "10.0.0.1:6379"}, "rate_limits": {` + zones + `}}]},
			{"handle": [{"handler": "reverse_proxy", "upstreams": [{"dial": "10.0.0.2:80"}]}]}]}]}]}}}}}`)
}

func TestPrepareConfigLeavesOutWhatALogCannotGive(t *testing.T) {
	cfg := jsonConfig(`
		"api": {"key": "{http.request.header.X-User}", "max_events": 10, "window": "1m", "concurrency": 5},
		"login": {"key": "{http.request.body.json.email}", "max_events": 5, "window": "15m"},
		"session": {"key": "{http.request.cookie.sid}", "max_events": 5, "window": "1m"},
		"conc": {"key": "{http.vars.client_ip}", "concurrency": 4}`, "")
	p, err := PrepareConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, e := range p.NotReplayed {
		reasons[e.Zone] = e.Reason
	}
	for zone, want := range map[string]string{
		"login":   "the request body is not in an access log",
		"session": "log_credentials",
		"conc":    "concurrency cap",
	} {
		if !strings.Contains(reasons[zone], want) {
			t.Errorf("zone %s: %q, want %q", zone, reasons[zone], want)
		}
	}
	if p.Zones["api"] == nil || len(p.Zones) != 1 || p.Headers[0] != "X-User" {
		t.Fatalf("zones %v headers %v", p.Zones, p.Headers)
	}
	notes := strings.Join(p.Notes, "\n")
	for _, want := range []string{"redis backend is replayed on the memory store", "concurrency caps are not replayed"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	s := string(p.JSON)
	if strings.Contains(s, "reverse_proxy") || strings.Contains(s, "10.0.0.1") || !strings.Contains(s, responderModule) || !strings.Contains(s, `"name":"`+storeModule+`"`) {
		t.Errorf("config: %s", s)
	}
	var v any
	if json.Unmarshal(p.JSON, &v) != nil {
		t.Error("not JSON")
	}
}

func TestPrepareConfigWithCredentialsLogged(t *testing.T) {
	p, err := PrepareConfig(jsonConfig(`"session": {"key": "{http.request.cookie.sid}", "max_events": 5, "window": "1m"}`, `"logs": {"should_log_credentials": true}, `))
	if err != nil || p.Zones["session"] == nil {
		t.Fatalf("%v %v", p, err)
	}
}

func TestPrepareConfigRefusesWhenNoZoneCanBeReplayed(t *testing.T) {
	_, err := PrepareConfig(jsonConfig(`"login": {"key": "{http.request.body.form.user}", "max_events": 5, "window": "15m", "cost": "{http.request.header.X-Cost}"}`, ""))
	if err == nil || !strings.Contains(err.Error(), `zone "login": key {http.request.body.form.user}: the request body is not in an access log`) {
		t.Fatalf("%v", err)
	}
	_, err = PrepareConfig([]byte(`{"apps": {"http": {"servers": {"s": {"routes": [{"handle": [{"handler": "file_server"}]}]}}}}}`))
	if err == nil || !strings.Contains(err.Error(), "no rate_limit handler") {
		t.Fatalf("%v", err)
	}
}

func TestCaddyfileBlockReplacesRates(t *testing.T) {
	src := `example.com {
	rate_limit {
		zone api {
			match {
				path /api/*
			}
			key {client_ip}
			events 100
			window 1m   # per client
			scope global {
				key global
				rate 1000/1m
			}
		}
	}
}`
	got, ok := caddyfileBlock(src, "api", map[string]Candidate{"": {Rate: "60/1m"}, "global": {Rate: "900/1m"}})
	want := `zone api {
	shadow # watch it for a week, then remove this line
	match {
		path /api/*
	}
	key {client_ip}
	rate 60/1m
	scope global {
		key global
		rate 900/1m
	}
}`
	if !ok || got != want {
		t.Fatalf("got %v:\n%s", ok, got)
	}
	if _, ok := caddyfileBlock(src, "nope", map[string]Candidate{"": {Rate: "1/1m"}}); ok {
		t.Fatal("found a zone that is not there")
	}
}
