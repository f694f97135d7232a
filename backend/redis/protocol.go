package redis

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/algorithms"
)

// The protocol between the store and its script: every mode, kind, argument
// position and reply position the two exchange is named here, once. The Go
// side builds each script call and reads each reply through these names;
// the script reads the same names from lua/00-protocol.lua, which is
// generated from this file's constants (modeDecide here is MODE_DECIDE
// there) by
//
//	go generate ./backend/redis/
//
// and TestProtocolLuaIsCurrent (internal/luagen) fails when the committed
// file is stale.
//
// A call is FCALL <function> <number of keys> KEYS... ARGV... (EVALSHA
// <sha> on a server without Functions, script.go): KEYS are the states it
// reads and writes, one per (zone, scope, key); ARGV is the header
// (argMode to argExpiryExtra), then keyArgs arguments per key, in the
// order of KEYS (mode modeMany sends a table of zones and refers to it,
// manyZonesArgs; mode modeUndo adds undoValues per key at the end).
// Positions are Lua's, from 1: ARGV[argMode] is the mode; a key's
// arguments are ARGV[o + keyArgKind] to ARGV[o + keyArgLockout], o being
// the arguments before them.

//go:generate go run ./internal/luagen

// Modes: what one call does, ARGV[argMode].
const (
	// modeDecide decides the keys of one request, all or nothing, and
	// replies the clock and the decision.
	modeDecide = "d"
	// modeDecideUndoable decides as modeDecide and adds to the reply,
	// per key, what modeUndo needs to take the decision back (undoValues):
	// the store sends it when a request's keys span several calls (Redis
	// Cluster slots), any of which may deny.
	modeDecideUndoable = "u"
	// modeRefund gives back what a granted decision took, each key in turn
	// (one key may be refunded twice in one call). Replies {}.
	modeRefund = "r"
	// modeUndo takes back a modeDecideUndoable decision that another
	// call of the same request denied: a key nobody wrote since gets its
	// value from before the decision back, any other is refunded. Replies {}.
	modeUndo = "x"
	// modeMany decides many requests, each on its own, all or nothing over
	// its own keys, as if each were a call of its own at the same instant:
	// the batch call. A request that fails does not fail the others.
	modeMany = "m"
	// modeCommit commits the reservations of a granted spend-budget
	// decision: the units stay taken. Replies {}.
	modeCommit = "k"
	// modeRelease releases them: the units come back, once, if the
	// reservation was still open. Replies {}.
	modeRelease = "e"
	// modeSettle charges a granted decision its real cost, known once the
	// response told it: less is refunded, more is charged past the limit.
	// Replies {}.
	modeSettle = "s"
	// modePeek (the admin script only) decides without writing anything:
	// the reply is modeDecide's.
	modePeek = "p"
	// modeGrant (the admin script only) gives each key cost units back,
	// whatever took them, never more than it holds. The reply is the
	// decision the grant read the states with.
	modeGrant = "g"
)

// Kinds of state: a key's keyArgKind argument, and the letter in its key
// (<prefix><zone>/<scope>/<kind>{<key>}, keys.go). The letters are one
// namespace: the keys beside a state (its lock-out record, its
// concurrency slots) take a letter of their own.
const (
	// kindBucket is the state of token_bucket, gcra and leaky_bucket
	// without max_delay: one time, the bucket's theoretical arrival time.
	kindBucket = 'b'
	// kindQueue is leaky_bucket with max_delay: the bucket's state, decided
	// as a queue that delays requests. It is an argument only: its keys
	// have kindBucket's letter, since the state is the same.
	kindQueue = 'q'
	// kindWindow is fixed_window (and calendar windows): a window's start
	// and count.
	kindWindow = 'w'
	// kindCounter is sliding_window_counter: a window's start and the
	// counts of it and of the window before.
	kindCounter = 'c'
	// kindLog is sliding_window: a log of events (lua/07-slidinglog.lua).
	kindLog = 'l'
	// kindLockout is the letter, in place of the kind, of a key's lock-out
	// record: it has the state's hash tag, so the script that decides the
	// key reads and writes it in the same call (and on a cluster, the same
	// slot), and one record serves whatever the algorithm, so a reload that
	// changes it keeps lock-outs. The record is "<end of the lock-out, Unix
	// ns>:<level>" and expires when its level is forgotten (the end plus
	// the longest step).
	kindLockout = 'o'
	// kindSlots is the letter of a key's concurrency slots (slots.go, whose
	// scripts are their own).
	kindSlots = 's'
)

// reservationsSuffix ends the key of a spend budget's open reservations:
// the state's key and this suffix, the same hash tag.
const reservationsSuffix = ":R"

// The header: ARGV[1] to ARGV[headerArgs].
const (
	// argMode is the mode (modeDecide, ...).
	argMode = 1
	// argNowSeconds and argNowNanos are the clock the script decides at,
	// as Unix seconds and the nanoseconds within the second; both are
	// clockServer in production, where the script reads Redis's TIME (so
	// instances with skewed clocks agree). Tests pass an injected clock, so
	// that Redis and the memory store see the same instants.
	argNowSeconds = 2
	argNowNanos   = 3
	// argExpiryExtra is milliseconds added to every expiry: "0" in
	// production; tests with an injected clock keep keys past their idle
	// time, which is harmless (an idle state decides like a fresh one).
	argExpiryExtra = 4
	// headerArgs is the number of header arguments.
	headerArgs = 4
)

// clockServer in argNowSeconds and argNowNanos tells the script to read
// the server's TIME.
const clockServer = ""

// The arguments of one key: ARGV[o + keyArgKind] to ARGV[o + keyArgs].
// keyArgCost, keyArgX1 and keyArgX2 are the request's; the others are the
// zone's (zoneConf), the same for every key of the zone and boxed once
// (zoneConf.boxed).
const (
	// keyArgKind is the kind of state (kindBucket, kindQueue, kindWindow,
	// kindCounter, kindLog).
	keyArgKind = 1
	// keyArgP1 is the rate parameter in ns: the interval T (kindBucket,
	// kindQueue) or the window W (the others). A calendar window writes
	// "<W>@<b0>,<b1>,<b2>,<b3>", the boundaries of three windows around
	// the caller's clock (budget.go); an adjusted bucket or queue writes
	// "<T>/<R>", deciding with T while its states stay written under the
	// registered R (adjust.go).
	keyArgP1 = 2
	// keyArgP2 is the burst (kindBucket), max_delay in ns (kindQueue) or
	// the limit (the windows and the log).
	keyArgP2 = 3
	// keyArgCost is the units, summed over the request's repeats of the
	// key and capped at maxCost.
	keyArgCost = 4
	// keyArgX1 is, for a decision, decideShadow or decideCounted; for a
	// refund, an undo, a settle, a commit or a release, the decision's
	// time in Unix ns (a bucket's refund and settle add ":<when it was to
	// be full again>", refundAt).
	keyArgX1 = 5
	// keyArgX2 is, for a decision, "" or a reservation "<ttl ms>:t<token>"
	// (budget.go); for a refund or an undo, the decision's delay in ns
	// (kindQueue); for a settle, the real cost; for a commit, a release
	// and the undo of a reserving decision, the token "t<token>".
	keyArgX2 = 6
	// keyArgLineage tells the calling process's policy history of the
	// zone from other processes' histories.
	keyArgLineage = 7
	// keyArgGeneration is the generation of the caller's current policy.
	keyArgGeneration = 8
	// keyArgHistory is the policy changes "at,gen,param,most;..." oldest
	// first (may be ""): a key written under an older generation is
	// rebased through them, as the memory store's table is.
	keyArgHistory = 9
	// keyArgFrom is "" or, for a zone whose kind of state changed,
	// "pos|kind,p1,p2,at,until;...": the kinds it may carry usage from,
	// newest first, when the change was and until when their keys may
	// live, and pos the place of the kind letter in the key (fromArg).
	keyArgFrom = 10
	// keyArgLockout is "" or, for a limit with lockout, "pos|step,...":
	// the lock-out steps in ns and the place of the kind letter in the
	// key (lockoutArg).
	keyArgLockout = 11
	// keyArgs is the number of arguments of one key.
	keyArgs = 11
)

// Values of keyArgX1 in a decision.
const (
	// decideShadow marks a shadow request: decided and counted, never
	// denied.
	decideShadow = "1"
	// decideCounted marks a request that is denied when a key denies it.
	decideCounted = "0"
)

// Mode modeMany sends each zone's arguments once per call: after the
// header, the number of zones (manyZonesArgs), then zoneArgs arguments per
// zone, the table the keys refer to; then each request, its head
// (manyHeadArgs) and what the head says follows. KEYS holds the
// requests' keys in the same order. A zone is a zoneConf and a p1: a
// calendar window's p1 is the caller's (keyArgP1).
//
// The head is either the request's number of keys, n, followed by
// manyKeyArgs arguments per key; or, for a request of one key without a
// reservation, one string standing for all of them, "<zone><x1><cost>":
// the place of the key's zone, manyHeadCounted or manyHeadShadow, and the
// cost, in decimal. Redis makes an object of every argument and the
// script a string of it, about 1k instructions each, more than the rest
// of a plain decision's arguments cost: most requests are of one key, of
// a few zones and of one cost, so their heads are few strings, which the
// store makes once (compactHeads) and the script reads once (headOf).
const (
	manyZonesArgs = 1
	manyHeadArgs  = 1
	// manyHeadCounted and manyHeadShadow are a one-key head's x1,
	// decideCounted and decideShadow: letters, so that the head is not
	// a number.
	manyHeadCounted = "c"
	manyHeadShadow  = "s"
)

// One zone's arguments in mode modeMany: the zone's arguments of
// keyArgKind to keyArgLockout, the request's left out.
const (
	zoneArgKind       = 1
	zoneArgP1         = 2
	zoneArgP2         = 3
	zoneArgLineage    = 4
	zoneArgGeneration = 5
	zoneArgHistory    = 6
	zoneArgFrom       = 7
	zoneArgLockout    = 8
	zoneArgs          = 8
)

// One key's arguments in mode modeMany: its zone, the place of its zone
// in the table from 1, and the request's arguments (keyArgCost, keyArgX1,
// keyArgX2).
const (
	manyKeyZone = 1
	manyKeyCost = 2
	manyKeyX1   = 3
	manyKeyX2   = 4
	manyKeyArgs = 4
)

// The reply of a decision (modeDecide, modeDecideUndoable, modePeek): the
// clock, then the decision. modeMany replies the clock, then per request
// its decision, its short decision (shortValues) or an error message
// alone (a string).
const (
	// replyNowSeconds and replyNowNanos are the clock the script decided
	// at, Unix seconds and nanoseconds within the second.
	replyNowSeconds = 1
	replyNowNanos   = 2
	// replyClockValues is the reply's values before the first decision.
	replyClockValues = 2
)

// modeMany's reply when no request failed: the same values packed into one
// bulk string, replyPackedBytes bytes each, a little-endian IEEE 754 double
// (struct.pack's replyPackedOrder, then replyPackedNumber per value). The
// store reads them in place, where go-redis boxes each number of an array
// (an allocation past 255); a reply with an error message stays an array.
// The values are Lua's numbers, which an array reply truncates to
// integers: the store truncates them as it reads them.
const (
	replyPackedOrder  = "<"
	replyPackedNumber = "d"
	replyPackedBytes  = 8
	// replyPackedChunk is the most values one struct.pack packs: unpack
	// puts them all on Lua's stack, which is bounded.
	replyPackedChunk = 256
)

// A decision: decisionAllowed, then keyReplyValues values per key in the
// order of KEYS; modeDecideUndoable adds undoValues per key after them.
const (
	// decisionAllowed is 1 if the request may proceed, else 0.
	decisionAllowed = 1
	// decisionHeadValues is a decision's values before its first key's.
	decisionHeadValues = 1
)

// One key's values in a decision, from 1: the algorithms.Result fields in
// the order the algorithms' Lua builds them, then keyReplyLogged.
const (
	keyReplyAllowed   = 1 // 1 if the key allows the request
	keyReplyLimit     = 2
	keyReplyRemaining = 3
	keyReplyRetry     = 4 // ns; -1 when the cost can never pass
	keyReplyReset     = 5 // ns
	keyReplyDelay     = 6 // ns, kindQueue
	// keyReplyLogged is when a sliding log logged the event, minus the
	// decision's time (0 for the others): a clock that stepped back logs
	// it at the newest event's time, which a refund must name.
	keyReplyLogged = 7
	// keyReplyValues is the number of one key's values.
	keyReplyValues = 7
)

// A short decision: modeMany's decision of a request of one key that the
// key allowed with its zone's p2 (keyArgP2) as the limit and no retry,
// delay or logged time, as most are. The reply of each value costs Redis
// and the script about 0.8k instructions (packed, more as an array): the
// rest follow from these and from the call.
const (
	// shortRemaining is -1 minus the units remaining: negative, where a
	// decision's first value (decisionAllowed) is 1 or 0.
	shortRemaining = 1
	shortReset     = 2 // ns
	// shortValues is the number of a short decision's values.
	shortValues = 2
)

// What an undo needs of one key: modeDecideUndoable replies it after the
// keys' values, and modeUndo takes it back as arguments after the keys'
// arguments, undoValues per key.
const (
	// undoBefore is the key's value before the decision ("" when none).
	undoBefore = 1
	// undoExpiry is its expiry then, in ms (PTTL: -1 without one).
	undoExpiry = 2
	// undoAfter is the value the decision wrote ("" when none).
	undoAfter = 3
	// undoValues is the number of values per key.
	undoValues = 3
)

// Go reads a reply, and writes arguments, in slices indexed from 0: the
// value at Lua position p is at index p-1.

// decisionLen is the number of values of a decision of keys keys, undo
// values left out.
func decisionLen(keys int) int { return decisionHeadValues + keyReplyValues*keys }

// replyClock is the clock a reply's values v (from its first) were
// decided at, in Unix ns.
func replyClock(v []int64) int64 { return v[replyNowSeconds-1]*1e9 + v[replyNowNanos-1] }

// packedValue reads the packed value (replyPackedBytes) that b starts with.
func packedValue(b string) int64 {
	return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(b[:replyPackedBytes]))))
}

// shortResult reads a short decision (from its first value, v) of a key
// of the zone conf, made at at.
func shortResult(v []int64, conf *zoneConf, at int64) (algorithms.Result, error) {
	limit, err := strconv.ParseInt(conf.p2, 10, 64)
	if err != nil {
		return algorithms.Result{}, fmt.Errorf("short decision of a limit %q", conf.p2)
	}
	return algorithms.Result{
		Allowed:    true,
		Limit:      limit,
		Remaining:  -1 - v[shortRemaining-1],
		ResetAfter: v[shortReset-1],
		At:         at,
	}, nil
}

// keyResult reads key k's values of decision d (from its first value), a
// decision made at at, and when a sliding log logged its event.
func keyResult(d []int64, k int, at int64) (r algorithms.Result, logged int64) {
	v := d[decisionHeadValues+keyReplyValues*k:]
	return algorithms.Result{
		Allowed:    v[keyReplyAllowed-1] == 1,
		Limit:      v[keyReplyLimit-1],
		Remaining:  v[keyReplyRemaining-1],
		RetryAfter: v[keyReplyRetry-1],
		ResetAfter: v[keyReplyReset-1],
		Delay:      v[keyReplyDelay-1],
		At:         at,
	}, at + v[keyReplyLogged-1]
}
