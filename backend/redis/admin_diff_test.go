package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/backend"
)

// adminStep is, besides the differential test's steps, an operator's
// operation on a random key in both stores: inspect (compared, and neither
// store changes: the next decision still agrees), grant or reset; then the
// key is inspected in both.
func (tw *twin) adminStep() {
	tw.t.Helper()
	i := tw.c.intn(len(tw.zones))
	key := keyNames[tw.c.intn(len(keyNames))]
	mem, red := backend.Admin(tw.cur.mem), backend.Admin(tw.cur.red)
	mz, rz := tw.cur.memZ[i], tw.cur.redZ[i]
	ctx := context.Background()
	var op string
	switch tw.c.intn(3) {
	case 0:
		op = "inspect"
	case 1:
		units := []int64{1, 2, 3, 7, 1 << 40}[tw.c.intn(5)]
		op = fmt.Sprintf("grant %d", units)
		mu, merr := mem.Grant(ctx, mz, key, units)
		ru, rerr := red.Grant(ctx, rz, key, units)
		if merr != nil || rerr != nil || mu != ru {
			tw.fail("%s %q: memory %+v %v, redis %+v %v", op, key, mu, merr, ru, rerr)
		}
	default:
		op = "reset"
		if err := errorsOf(mem.Reset(ctx, mz, key), red.Reset(ctx, rz, key)); err != nil {
			tw.fail("reset: %v", err)
		}
	}
	tw.log = append(tw.log, fmt.Sprintf("t=%d %s %s %q", tw.clock, op, mz.Name(), key))
	mu, merr := mem.Inspect(ctx, mz, key)
	ru, rerr := red.Inspect(ctx, rz, key)
	if merr != nil || rerr != nil || mu != ru {
		tw.fail("inspect after %s %q: memory %+v %v\n                     redis  %+v %v", op, key, mu, merr, ru, rerr)
	}
	tw.granted = nil // a refund after a grant or reset may find less to give back in one store
}

func errorsOf(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// TestAdminDifferential: inspect, grant and reset answer alike in both
// stores, and leave them deciding alike, through random traffic, time and
// reloads.
func TestAdminDifferential(t *testing.T) {
	client := standaloneClient(t)
	for run := range diffRuns(150) {
		tw := newTwin(t, prng{rand.New(rand.NewPCG(uint64(run), 23))}, client, run%4 == 3)
		t.Logf("run %d", run)
		for range 120 {
			if tw.c.intn(5) == 0 {
				tw.adminStep()
			} else {
				tw.step()
			}
		}
	}
}
