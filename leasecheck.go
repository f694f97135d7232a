package sluice

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/internal/keys"
)

// leaseShare is the most of max_events a lease may take, in percent: the
// fleet may admit instances × lease units more than the limit, so a lease
// is for loose limits where that is noise.
const leaseShare = 100

// checkLease refuses a lease that would make the limit much looser than
// its rate, that could never be used, or that would weaken a limit which
// guards accounts: those keep one decision per request.
func (l *Limit) checkLease(alg string) error {
	n := l.Lease
	switch {
	case n == 0:
		return nil
	case n < 0:
		return optionErrorf("lease", "lease must be at least 2, got %d", n)
	case n == 1:
		return optionErrorf("lease", "lease 1 takes one unit per call, as no lease does: remove it, or lease at least 2")
	case n > l.MaxEvents/leaseShare:
		return optionErrorf("lease", "lease %d is more than 1%% of rate %s (%d): the fleet could admit %d more per instance; lower lease or raise max_events",
			n, rateText(l.MaxEvents, time.Duration(l.Window)), l.MaxEvents/leaseShare, n)
	case algorithms.UsesBurst(alg) && l.Burst > 0 && n > l.Burst:
		return optionErrorf("lease", "lease %d is more than burst %d: the bucket never holds that many units at once", n, l.Burst)
	case l.Cost != nil && l.Cost.expr == "" && l.Cost.n > n:
		return optionErrorf("lease", "lease %d is less than cost %d: every request would go to the backend; raise lease or remove it", n, l.Cost.n)
	case l.CostMin > n:
		return optionErrorf("lease", "lease %d is less than cost_min %d: every request would go to the backend; raise lease or remove it", n, l.CostMin)
	case alg == algorithms.NameLeakyBucket:
		return optionErrorf("lease", "lease: a leaky_bucket lets requests out one interval apart, which units spent locally from a lease would not: use token_bucket or gcra")
	case l.Fail == FailClosed:
		return optionErrorf("lease", "lease: a limit that fails closed promises never to admit unchecked, which spending leased units locally does: remove lease or fail closed")
	case l.Hash != "":
		return optionErrorf("lease", "lease: a hashed key is an identity worth protecting (login, one-time code), where every attempt counts: remove lease")
	}
	for _, norm := range l.Normalize {
		switch norm.Name {
		case keys.NormEmail, keys.NormPhone, keys.NormCredentials:
			return optionErrorf("lease", "lease: a key normalized as %s is an account identifier (login, one-time code), where every attempt counts: remove lease", norm.Name)
		}
	}
	if t, err := keys.ParseTemplate(l.Key); err == nil && (t.NeedsBody() || readsWholeBody(t)) {
		return optionErrorf("lease", "lease: a key read from the request body is an account identifier (login, one-time code), where every attempt counts: remove lease")
	}
	return nil
}

// readsWholeBody reports whether t reads Caddy's own placeholders for the
// whole request body, which are read from the body as much as a field is.
func readsWholeBody(t keys.Template) bool {
	for _, p := range t.Placeholders() {
		if p == "http.request.body" || p == "http.request.body_base64" {
			return true
		}
	}
	return false
}

// rateText writes a rate as the Caddyfile's rate option does: 1000/1m.
func rateText(events int64, window time.Duration) string {
	d := window.String()
	for _, unit := range []string{"h", "m"} {
		if strings.HasSuffix(d, unit+"0m0s") {
			d = strings.TrimSuffix(d, "0m0s")
		} else if strings.HasSuffix(d, unit+"0s") {
			d = strings.TrimSuffix(d, "0s")
		}
	}
	return fmt.Sprintf("%d/%s", events, d)
}
