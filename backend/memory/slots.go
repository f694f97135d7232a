package memory

import "math/bits"

// slots is an open-addressing hash table from key hash to state, with linear
// probing: the structure the memory store spends its time in. Compared with
// a Go map it finds an existing key with one probe into one contiguous
// array (a slot is 16 bytes for the bucket algorithms, four to a cache
// line), which is what keeps a decision over a million keys fast, and it
// holds about 26 bytes per key instead of about 38.
//
// A hash of 0 marks an empty slot; hash() never returns 0. The home slot of
// a hash is taken from its high bits (h·len/2⁶⁴), so the low bits that pick
// the shard do not bias it.
type slots[S any] struct {
	e []slot[S]
	n int
}

type slot[S any] struct {
	h uint64
	s S
}

const minSlots = 16

func (t *slots[S]) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.e)))
	return int(hi)
}

// find returns the index of h and true, or the index of the empty slot
// where h would be inserted and false. The table must not be empty.
func (t *slots[S]) find(h uint64) (int, bool) {
	i := t.home(h)
	for {
		switch t.e[i].h {
		case h:
			return i, true
		case 0:
			return i, false
		}
		if i++; i == len(t.e) {
			i = 0
		}
	}
}

// next is the index after i, wrapping around.
func (t *slots[S]) next(i int) int {
	if i++; i == len(t.e) {
		return 0
	}
	return i
}

// get returns the state of h, or the zero state.
func (t *slots[S]) get(h uint64) S {
	if t.n > 0 {
		if i, ok := t.find(h); ok {
			return t.e[i].s
		}
	}
	var zero S
	return zero
}

// insert puts a new h with state s. The caller has checked that h is absent.
func (t *slots[S]) insert(h uint64, s S) {
	// Keep the load at most 3/4: probes stay short and mostly within a
	// cache line.
	if len(t.e) == 0 || 4*(t.n+1) > 3*len(t.e) {
		t.resize(max(minSlots, len(t.e)+len(t.e)/2))
	}
	i, _ := t.find(h)
	t.e[i] = slot[S]{h: h, s: s}
	t.n++
}

// resize rehashes into size slots (size must exceed t.n).
func (t *slots[S]) resize(size int) {
	old := t.e
	t.e = make([]slot[S], size)
	for _, sl := range old {
		if sl.h != 0 {
			i, _ := t.find(sl.h)
			t.e[i] = sl
		}
	}
}

// remove deletes the entry at i, shifting later entries of its probe chain
// back so that no search stops early at the hole (no tombstones).
func (t *slots[S]) remove(i int) {
	n := len(t.e)
	hole := i
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		if t.e[j].h == 0 {
			break
		}
		// The entry at j may move into the hole only if its home is not
		// in the cyclic range (hole, j].
		k := t.home(t.e[j].h)
		if (j > hole && (k <= hole || k > j)) || (j < hole && k <= hole && k > j) {
			t.e[hole] = t.e[j]
			hole = j
		}
	}
	t.e[hole] = slot[S]{}
	t.n--
}

// shrink gives memory back once the table is mostly empty.
func (t *slots[S]) shrink() {
	if len(t.e) > 4*minSlots && 8*t.n < len(t.e) {
		t.resize(max(minSlots, 2*t.n))
	}
}
