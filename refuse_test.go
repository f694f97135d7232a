package sluice

import (
	"strings"
	"testing"
)

func TestContractConfigErrors(t *testing.T) {
	for _, tt := range []struct{ handler, want string }{
		{`"respond": "html"`, `respond must be json, problem or text, got "html"`},
		{`"headers": "ietf"`, `headers must be draft, legacy, both or none, got "ietf"`},
		{`"rate_limits": {"z": {"window": "1m", "max_events": 5, "headers": "x"}}`, `zone "z": headers must be draft, legacy, both or none`},
		{`"rate_limits": {"z": {"window": "1m", "max_events": 5, "status": 302}}`, `zone "z": status must be from 400 to 599, got 302`},
		{`"rate_limits": {"z": {"window": "1m", "max_events": 5, "status": 600}}`, `zone "z": status must be from 400 to 599, got 600`},
		{`"headers": "draft", "rate_limits": {"ঢাকা": {"window": "1m", "max_events": 5}}`, `cannot be sent in a RateLimit-Policy field`},
	} {
		rl := `"rate_limits": {"contract_cfg": {"window": "1m", "max_events": 5}}, `
		if strings.Contains(tt.handler, "rate_limits") {
			rl = ""
		}
		err := validate(t, `{"handler": "rate_limit", `+rl+tt.handler+`}`)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.handler, err, tt.want)
		}
	}
	// A name a field cannot hold is fine where no field is sent.
	if err := validate(t, `{"handler": "rate_limit", "headers": "legacy", "rate_limits": {"ঢাকা_contract": {"window": "1m", "max_events": 5}}}`); err != nil {
		t.Fatal(err)
	}
}
