package redis

import (
	"context"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

// Script arguments boxed once, so that building a call does not allocate
// them.
var (
	countedArg any = decideCounted
	shadowArg  any = decideShadow
	// zoneIndex boxes the places of the first zones in a call's table.
	zoneIndex = func() (b [16]any) {
		for i := range b {
			b[i] = i + 1
		}
		return
	}()
	// compactHeads holds the heads that stand for a request of one key
	// (protocol.go) of each of the first zones of a call's table and
	// each cost below compactCosts, counted and shadow.
	compactHeads = func() (h [len(zoneIndex)][compactCosts][2]string) {
		for z := range h {
			for c := range h[z] {
				for i, x1 := range [2]string{manyHeadCounted, manyHeadShadow} {
					h[z][c][i] = strconv.Itoa(z+1) + x1 + strconv.Itoa(c)
				}
			}
		}
		return
	}()
)

// compactCosts bounds the costs of compactHeads: a route's cost is
// mostly 1, or another small constant.
const compactCosts = 64

// manyZone is one zone of a modeMany call's table: a conf, with the p1
// of its keys (a calendar window's is the caller's; nil: the conf's).
type manyZone struct {
	conf *zoneConf
	p1   any
}

// manyCmd appends to buf the script call (modeMany) that decides the
// requests of live, each on its own, and returns it: the keys, the
// header, the table of the zones the keys belong to (each zone's
// arguments sent once), then each request: one head that stands for it,
// or its key count and keys, each naming its zone by its place in the
// table.
func (s *Store) manyCmd(ctx context.Context, live []*pending, buf []any) (*goredis.Cmd, []any) {
	var small [8]manyZone // the zones of a batch are few
	zones := small[:0]
	nkeys := 0
	for _, p := range live {
		nkeys += len(p.items)
		for i := range p.items {
			if zoneOf(zones, &p.items[i]) == 0 {
				zones = append(zones, manyZone{p.items[i].conf, p.items[i].p1})
			}
		}
	}
	verb, id := s.callHead()
	args := append(buf[:0], verb, id, nkeys)
	// Keys and the requests' strings go as pointers into their items,
	// which go-redis writes as the strings they point to: boxing a
	// string would allocate. The items outlive the call.
	for _, p := range live {
		for i := range p.items {
			args = append(args, &p.items[i].key)
		}
	}
	args = append(args, s.header(modeMany)...)
	args = slices.Grow(args, manyZonesArgs+len(zones)*zoneArgs)
	args = append(args, len(zones))
	for _, z := range zones {
		var a [zoneArgs]any
		b := &z.conf.boxed
		a[zoneArgKind-1] = b[keyArgKind-1]
		a[zoneArgP1-1] = b[keyArgP1-1]
		if z.p1 != nil {
			a[zoneArgP1-1] = z.p1
		}
		a[zoneArgP2-1] = b[keyArgP2-1]
		a[zoneArgLineage-1] = b[keyArgLineage-1]
		a[zoneArgGeneration-1] = b[keyArgGeneration-1]
		a[zoneArgHistory-1] = b[keyArgHistory-1]
		a[zoneArgFrom-1] = b[keyArgFrom-1]
		a[zoneArgLockout-1] = b[keyArgLockout-1]
		args = append(args, a[:]...)
	}
	for _, p := range live {
		if h := compactHead(zones, p.items); h != nil {
			args = append(args, h)
			continue
		}
		args = slices.Grow(args, manyHeadArgs+len(p.items)*manyKeyArgs)
		args = append(args, len(p.items))
		for i := range p.items {
			it := &p.items[i]
			var a [manyKeyArgs]any
			z := zoneOf(zones, it)
			if z <= len(zoneIndex) {
				a[manyKeyZone-1] = zoneIndex[z-1]
			} else {
				a[manyKeyZone-1] = z
			}
			// The cost goes as an *int64, which go-redis writes as a
			// decimal: an int64 past 255 would allocate when boxed.
			a[manyKeyCost-1] = &it.cost
			a[manyKeyX1-1] = countedArg
			if it.shadow {
				a[manyKeyX1-1] = shadowArg
			}
			a[manyKeyX2-1] = &it.resv
			args = append(args, a[:]...)
		}
	}
	return goredis.NewCmd(ctx, args...), args
}

// compactHead is the head that stands for the whole request of items, a
// *string (go-redis writes it without boxing it); nil when there is
// none and the request goes as its keys' arguments.
func compactHead(zones []manyZone, items []item) *string {
	if len(items) != 1 {
		return nil
	}
	it := &items[0]
	z := zoneOf(zones, it)
	if z > len(compactHeads) || it.cost < 0 || it.cost >= compactCosts || it.resv != "" {
		return nil
	}
	x1 := 0
	if it.shadow {
		x1 = 1
	}
	return &compactHeads[z-1][it.cost][x1]
}

// zoneOf is the place of it's zone in zones, from 1; 0 when it is not
// there.
func zoneOf(zones []manyZone, it *item) int {
	for j := range zones {
		if zones[j].conf == it.conf && zones[j].p1 == it.p1 {
			return j + 1
		}
	}
	return 0
}
