package backend

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/algorithms"
)

type reg struct {
	owner any
	p     algorithms.Policy
}

func (r reg) RegisteredBy() any                   { return r.owner }
func (r reg) RegisteredPolicy() algorithms.Policy { return r.p }

func TestCheckRates(t *testing.T) {
	a, b := algorithms.Policy{Limit: 1, Window: 60e9}, algorithms.Policy{Limit: 2, Window: 60e9}
	cfg1, cfg2 := new(int), new(int)
	regs := []reg{{cfg1, a}, {nil, b}}
	tests := []struct {
		name string
		r    reg
		want string
	}{
		{"same config, same rate", reg{cfg1, a}, ""},
		{"same config, another rate", reg{cfg1, b}, "defined twice in this config with different rates (1 per 1m and 2 per 1m)"},
		{"another config, another rate (a reload)", reg{cfg2, b}, ""},
		{"no owner", reg{nil, b}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRates(regs, tt.r)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
