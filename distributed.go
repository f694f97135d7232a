package sluice

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/algorithms"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/internal/fleet"
)

// Distributed shares the counts of a fleet of Caddy instances through a
// Caddy storage they all use: each instance writes, every WriteInterval,
// how many events each key of each zone has in its window, and reads the
// others' every ReadInterval. A request is then denied when this
// instance's count plus the others' last known counts would go over the
// zone's limit. The sharing is eventually consistent, not exact: between
// two syncs each instance admits from its own quota what the others have
// not reported yet (backend redis shares exactly).
//
// The files are those of mholt/caddy-ratelimit (rate_limit/instances/
// <instance id>.rlstate, the same encoding), so a fleet can mix both
// modules while it migrates.
type Distributed struct {
	// WriteInterval is how often this instance's counts are written to
	// storage. Default: 5s; at least 10ms.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// ReadInterval is how often the other instances' counts are read from
	// storage. Default: 5s; at least 10ms.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`

	// PurgeAge deletes another instance's file from storage once it has
	// not been written for this long (an instance that left the fleet).
	// Default: 0, never deleted; a file older than a zone's window counts
	// nothing for that zone either way.
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`
}

// intervals are the read and write intervals in force: the configured
// ones, or the default for those unset.
func (d *Distributed) intervals() (read, write time.Duration) {
	return cmp.Or(time.Duration(d.ReadInterval), fleet.DefaultInterval), cmp.Or(time.Duration(d.WriteInterval), fleet.DefaultInterval)
}

func (d *Distributed) check() error {
	read, write := d.intervals()
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"read_interval", read}, {"write_interval", write}} {
		if f.v < fleet.MinInterval {
			return fmt.Errorf("distributed: %s must be at least %s, got %s", f.name, fleet.MinInterval, f.v)
		}
	}
	if d.PurgeAge < 0 {
		return fmt.Errorf("distributed: purge_age must not be negative, got %s", time.Duration(d.PurgeAge))
	}
	return nil
}

// fleetMember is a handler's use of the fleet of its storage.
type fleetMember struct {
	m      *fleet.Member
	logger *zap.Logger
}

// provisionDistributed joins the fleet of the handler's storage.
func (h *plan) provisionDistributed(ctx caddy.Context) error {
	var storage certmagic.Storage
	if len(h.StorageRaw) > 0 {
		mod, err := ctx.LoadModule(h.Handler, "StorageRaw")
		if err != nil {
			return fmt.Errorf("storage: %v", err)
		}
		if storage, err = mod.(caddy.StorageConverter).CertMagicStorage(); err != nil {
			return fmt.Errorf("storage: %v", err)
		}
		if h.Distributed == nil {
			h.logger.Warn("storage does nothing without distributed")
			return nil
		}
	}
	if h.Distributed == nil {
		return nil
	}
	if err := h.Distributed.check(); err != nil {
		return err
	}
	if _, ok := h.store.(*memory.Store); !ok {
		return fmt.Errorf("distributed: the backend already decides where counts are kept (backend redis shares them across a fleet, exactly): remove distributed")
	}
	admin, ok := h.store.(backend.Admin)
	if !ok {
		return fmt.Errorf("distributed: the backend cannot report its counts")
	}
	var limits []fleet.Limit
	for _, z := range h.zones {
		for _, l := range z.limits {
			kind := algorithms.KindOf(l.algorithm)
			switch kind {
			case algorithms.KindLog, algorithms.KindWindow, algorithms.KindCounter:
			default:
				return fmt.Errorf("zone %q: algorithm: distributed shares counts of events in a window, which %s does not keep: use sliding_window, sliding_window_counter or fixed_window, or remove distributed", z.name, l.algorithm)
			}
			limits = append(limits, fleet.Limit{ID: l, Zone: z.name, Scope: l.scope, Window: int64(l.Window), MaxKeys: int64(l.MaxKeys),
				Fixed: kind == algorithms.KindWindow, Counts: storeCounts{admin, l.handle}})
		}
	}
	if storage == nil {
		storage = h.distStorage
	}
	if storage == nil {
		storage = ctx.Storage()
	}
	id, err := caddy.InstanceID()
	if err != nil {
		return fmt.Errorf("distributed: instance id: %v", err)
	}
	d := h.Distributed
	read, write := d.intervals()
	h.fleet = &fleetMember{m: fleet.Join(fleet.Config{Storage: storage, Instance: id.String(),
		ReadInterval: read, WriteInterval: write, PurgeAge: time.Duration(d.PurgeAge),
		Now: h.now, Logger: h.logger}, limits), logger: h.logger}
	return nil
}

// storeCounts reads a limit's counts in the handler's store for the fleet.
type storeCounts struct {
	admin  backend.Admin
	handle backend.Limit
}

func (c storeCounts) Usage(ctx context.Context, key string) (fleet.Usage, error) {
	u, err := c.admin.Inspect(ctx, c.handle, key)
	return fleet.Usage{Used: u.Limit - u.Remaining, RetryAfter: u.RetryAfter, ResetAfter: u.ResetAfter}, err
}

func (m *fleetMember) leave() { m.m.Leave() }

// check adds the other instances' counts to a decision the store allowed:
// when a request's key has fewer units left here than the others used,
// the decision is given back to the store and turned into a denial. It
// reports whether the request is still allowed.
func (m *fleetMember) check(ctx context.Context, store backend.Store, limits []*limit, reqs []backend.Request, out []algorithms.Result, now int64) bool {
	var v fleet.Verdict
	for i, l := range limits {
		if !reqs[i].Shadow {
			m.m.Check(&v, i, l, reqs[i].Key, out[i].Remaining, now)
		}
	}
	i, wait, denied := v.Denied()
	if !denied {
		return true
	}
	if err := store.Refund(context.WithoutCancel(ctx), reqs, out); err != nil {
		m.logger.Error("distributed: giving back a request the fleet denies", zap.Error(err))
	}
	res := &out[i]
	*res = algorithms.Result{Limit: res.Limit, RetryAfter: wait, ResetAfter: max(res.ResetAfter, wait), At: res.At}
	return false
}
