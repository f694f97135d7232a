package keys

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of a JSON body: deeper documents are
// unreadable, so a body cannot make the parser recurse without limit.
const maxDepth = 64

// JSONPaths is the set of JSON paths that a handler's keys and costs read,
// found together in one pass over a body.
//
// The parser is hand-written rather than encoding/json's Decoder, whose
// token-by-token API took 13 ms for a 64 KiB array of zeros (47 times
// json.Valid), or a third-party tokenizer: what a key needs (several paths in
// one pass, keys matched in any case with a repeated spelling on the path
// refused, numbers reduced to their value, bounded depth, no allocation for
// what is skipped) is the whole of the work, and a short parser that is
// fuzzed against encoding/json keeps those rules in one place.
type JSONPaths struct {
	raw  []string
	segs [][][]byte // segs[p][level]: the path's object keys
	idx  [][]int    // idx[p][level]: the array index a segment names, or -1
	ends [][]uint64 // ends[chunk][level]: the paths of a chunk of 64 that end at level
}

// Add puts path (dot-separated object keys and array indexes) in the set
// and returns its index in the results of Extract.
func (q *JSONPaths) Add(path string) int {
	if i := q.index(path); i >= 0 {
		return i
	}
	parts := strings.Split(path, ".")
	segs := make([][]byte, len(parts))
	idx := make([]int, len(parts))
	for i, s := range parts {
		segs[i] = []byte(s)
		idx[i] = arrayIndex(s)
	}
	p := len(q.raw)
	q.raw = append(q.raw, path)
	q.segs = append(q.segs, segs)
	q.idx = append(q.idx, idx)
	if p%64 == 0 {
		q.ends = append(q.ends, nil)
	}
	ends := &q.ends[p/64]
	for len(*ends) <= len(parts) {
		*ends = append(*ends, 0)
	}
	(*ends)[len(parts)] |= 1 << (p % 64)
	return p
}

// index returns the index of path in the set, or -1.
func (q *JSONPaths) index(path string) int {
	for i, p := range q.raw {
		if p == path {
			return i
		}
	}
	return -1
}

// arrayIndex is the array index s names: decimal digits without a sign or
// a leading zero, as JavaScript reads an index; -1 for anything else.
func arrayIndex(s string) int {
	if s == "" || len(s) > 9 || (s[0] == '0' && len(s) > 1) {
		return -1
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return -1
		}
		n = n*10 + int(s[i]-'0')
	}
	return n
}

// Result is the value found at one path: Err wraps ErrAbsent when the
// document does not have it, ErrAmbiguous when an object on the way holds
// the key twice, and ErrUnreadable when the document is not valid JSON or
// the value is not a scalar.
type Result struct {
	Value string
	Err   error
}

// pathState is what one pass learns about one path.
type pathState struct {
	found     bool
	ambiguous bool
	composite bool // an object or array where a scalar was wanted
	value     string
	key       string // the repeated key, for the error
}

// Extract finds every path of the set in data, in one pass for up to 64
// paths, and returns their results in out (reused when large enough),
// indexed as Add numbered the paths. The whole document must be valid
// (RFC 8259, UTF-8, at most 64 levels deep), or every path is unreadable.
func (q *JSONPaths) Extract(data []byte, out []Result) []Result {
	if cap(out) < len(q.raw) {
		out = make([]Result, len(q.raw))
	}
	out = out[:len(q.raw)]
	clear(out)
	for lo := 0; lo < len(q.raw); lo += 64 {
		q.extract(data, lo, min(lo+64, len(q.raw)), out)
	}
	return out
}

func (q *JSONPaths) extract(data []byte, lo, hi int, out []Result) {
	// The states of a handful of paths live on the stack: s does not
	// escape (its methods only read and write through it).
	var small [4]pathState
	s := jsonScan{data: data, q: q, lo: lo, ends: q.ends[lo/64]}
	if n := hi - lo; n <= len(small) {
		s.states = small[:n]
	} else {
		s.states = make([]pathState, n)
	}
	active := uint64(math.MaxUint64) >> (64 - (hi - lo))
	err := s.document(active)
	for i := range s.states {
		st, r := &s.states[i], &out[lo+i]
		switch {
		case err != nil:
			r.Err = &fieldError{kind: ErrUnreadable, msg: "body is not valid JSON: ", detail: err}
		case st.ambiguous:
			r.Err = &fieldError{kind: ErrAmbiguous, msg: "key " + strconv.Quote(st.key) + " repeated"}
		case st.composite:
			r.Err = &fieldError{kind: ErrUnreadable, msg: "JSON field " + q.raw[lo+i] + " is an object or array, not a string, number or boolean"}
		case st.found:
			r.Value = st.value
		default:
			r.Err = &fieldError{kind: ErrAbsent, msg: "JSON field " + q.raw[lo+i] + " missing"}
		}
	}
}

// fieldError says why a field has no value; it wraps the sentinel of its
// kind (ErrAbsent, ErrAmbiguous, ErrUnreadable) without formatting it
// until someone asks.
type fieldError struct {
	kind   error
	msg    string
	detail error
}

func (e *fieldError) Error() string {
	if e.detail != nil {
		return e.kind.Error() + ": " + e.msg + e.detail.Error()
	}
	return e.kind.Error() + ": " + e.msg
}

func (e *fieldError) Unwrap() error { return e.kind }

// JSONField returns the scalar at path (dot-separated object keys and
// array indexes: "user.phone", "items.0.id") of the JSON document data.
// The whole document must be valid and the value a string, number or
// boolean; numbers are written canonically (CanonicalNumber). Keys match
// exactly, or else in another case when that is the only spelling present
// (Go's encoding/json reads "PHONE" into a field named phone). No object on
// the path may hold the key twice, in any mix of cases: parsers disagree on
// which one wins, and the limiter must read the same value as the
// application behind it (ErrAmbiguous).
func JSONField(data []byte, path string) (string, error) {
	var q JSONPaths
	q.Add(path)
	var out [1]Result
	r := q.Extract(data, out[:])[0]
	return r.Value, r.Err
}

// jsonScan is one validating pass over a document, following a set of
// paths: bit i of a mask stands for path lo+i.
type jsonScan struct {
	data   []byte
	i      int
	depth  int
	q      *JSONPaths
	lo     int
	ends   []uint64
	states []pathState
}

var (
	errEnd    = errors.New("unexpected end of data")
	errDepth  = fmt.Errorf("nested more than %d levels deep", maxDepth)
	errUTF8   = errors.New("invalid UTF-8")
	errEscape = errors.New("invalid escape in a string")
)

func (s *jsonScan) errAt(what string) error {
	if s.i >= len(s.data) {
		return errEnd
	}
	return fmt.Errorf("%s at offset %d", what, s.i)
}

func (s *jsonScan) document(active uint64) error {
	if len(s.data) >= 2 && (s.data[0] == 0xfe && s.data[1] == 0xff || s.data[0] == 0xff && s.data[1] == 0xfe) {
		return errors.New("UTF-16 byte order mark")
	}
	if bytes.HasPrefix(s.data, []byte("\uFEFF")) {
		return errors.New("byte order mark")
	}
	if err := s.value(active, 0); err != nil {
		return err
	}
	s.space()
	if s.i != len(s.data) {
		return s.errAt("data after the document")
	}
	return nil
}

func (s *jsonScan) space() {
	d, i := s.data, s.i
	for i < len(d) && (d[i] == ' ' || d[i] == '\n' || d[i] == '\r' || d[i] == '\t') {
		i++
	}
	s.i = i
}

// value reads one value. active are the paths that lead here; those that
// end at this level want this value.
func (s *jsonScan) value(active uint64, level int) error {
	s.space()
	if s.i >= len(s.data) {
		return errEnd
	}
	var want uint64
	if level < len(s.ends) {
		want = active & s.ends[level]
	}
	deeper := active &^ want
	switch c := s.data[s.i]; {
	case c == '{' || c == '[':
		s.setComposite(want)
		if s.depth++; s.depth > maxDepth {
			return errDepth
		}
		var err error
		if c == '{' {
			err = s.object(deeper, level)
		} else {
			err = s.array(deeper, level)
		}
		s.depth--
		return err
	case c == '"':
		start := s.i
		escaped, err := s.str()
		if err != nil || want == 0 {
			return err
		}
		raw := s.data[start+1 : s.i-1]
		var v string
		if escaped {
			v = string(unescape(nil, raw))
		} else {
			v = string(raw)
		}
		s.set(want, v)
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		if err := s.number(); err != nil {
			return err
		}
		if want != 0 {
			s.set(want, CanonicalNumber(s.data[start:s.i]))
		}
	case c == 't':
		if err := s.literal("true"); err != nil || want == 0 {
			return err
		}
		s.set(want, "true")
	case c == 'f':
		if err := s.literal("false"); err != nil || want == 0 {
			return err
		}
		s.set(want, "false")
	case c == 'n':
		return s.literal("null") // null is no value: the field is absent
	default:
		return s.errAt("invalid character")
	}
	return nil
}

// set records v as the value of the paths in mask.
func (s *jsonScan) set(mask uint64, v string) {
	for ; mask != 0; mask &= mask - 1 {
		st := &s.states[bits.TrailingZeros64(mask)]
		st.found, st.value = true, v
	}
}

// setComposite records that the paths in mask lead to an object or array.
func (s *jsonScan) setComposite(mask uint64) {
	for ; mask != 0; mask &= mask - 1 {
		s.states[bits.TrailingZeros64(mask)].composite = true
	}
}

// setAmbiguous records that an object holds the key of the paths in mask
// twice.
func (s *jsonScan) setAmbiguous(mask uint64, key []byte) {
	for ; mask != 0; mask &= mask - 1 {
		if st := &s.states[bits.TrailingZeros64(mask)]; !st.ambiguous {
			st.ambiguous, st.key = true, string(key)
		}
	}
}

func (s *jsonScan) literal(lit string) error {
	if !bytes.HasPrefix(s.data[s.i:], []byte(lit)) {
		return s.errAt("invalid literal")
	}
	s.i += len(lit)
	return nil
}

func (s *jsonScan) object(active uint64, level int) error {
	s.i++ // {
	s.space()
	if s.i < len(s.data) && s.data[s.i] == '}' {
		s.i++
		return nil
	}
	var seen uint64
	for {
		s.space()
		if s.i >= len(s.data) || s.data[s.i] != '"' {
			return s.errAt("want an object key")
		}
		start := s.i
		escaped, err := s.str()
		if err != nil {
			return err
		}
		var match uint64
		if active != 0 {
			key := s.data[start+1 : s.i-1]
			var kb [64]byte
			if escaped {
				key = unescape(kb[:0], key)
			}
			for m := active; m != 0; m &= m - 1 {
				b := bits.TrailingZeros64(m)
				if bytes.EqualFold(key, s.q.segs[s.lo+b][level]) {
					match |= 1 << b
				}
			}
			s.setAmbiguous(match&seen, key)
			seen |= match
		}
		s.space()
		if s.i >= len(s.data) || s.data[s.i] != ':' {
			return s.errAt("want a colon")
		}
		s.i++
		if err := s.value(match, level+1); err != nil {
			return err
		}
		if done, err := s.more('}'); done || err != nil {
			return err
		}
	}
}

func (s *jsonScan) array(active uint64, level int) error {
	s.i++ // [
	s.space()
	if s.i < len(s.data) && s.data[s.i] == ']' {
		s.i++
		return nil
	}
	for n := 0; ; n++ {
		var match uint64
		for m := active; m != 0; m &= m - 1 {
			b := bits.TrailingZeros64(m)
			if s.q.idx[s.lo+b][level] == n {
				match |= 1 << b
			}
		}
		if err := s.value(match, level+1); err != nil {
			return err
		}
		if done, err := s.more(']'); done || err != nil {
			return err
		}
	}
}

// more reads what follows a member of an object or array: a comma, or
// the closing bracket, which makes done true.
func (s *jsonScan) more(closing byte) (done bool, err error) {
	s.space()
	if s.i >= len(s.data) {
		return false, errEnd
	}
	switch s.data[s.i] {
	case ',':
		s.i++
		return false, nil
	case closing:
		s.i++
		return true, nil
	}
	return false, s.errAt("want a comma or " + string(closing))
}

// str reads a string from its opening quote past its closing one,
// checking escapes and UTF-8, and reports whether it has escapes.
func (s *jsonScan) str() (escaped bool, err error) {
	s.i++ // "
	d := s.data
	for s.i < len(d) {
		c := d[s.i]
		switch {
		case c == '"':
			s.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			n, err := escapeLen(d[s.i:])
			if err != nil {
				return false, fmt.Errorf("%w at offset %d", err, s.i)
			}
			s.i += n
		case c < 0x20:
			return false, s.errAt("control character in a string")
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(d[s.i:])
			if r == utf8.RuneError && n == 1 {
				return false, fmt.Errorf("%w at offset %d", errUTF8, s.i)
			}
			s.i += n
		}
	}
	return false, errEnd
}

// escapeLen is the length of the escape sequence at the start of b. A
// \u escape of a UTF-16 surrogate must be one of a pair: a lone surrogate
// is no character, and parsers differ in what they make of it.
func escapeLen(b []byte) (int, error) {
	if len(b) < 2 {
		return 0, errEnd
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		r, ok := hex4(b[2:])
		if !ok {
			return 0, errEscape
		}
		if !utf16.IsSurrogate(r) {
			return 6, nil
		}
		if r >= 0xdc00 || len(b) < 12 || b[6] != '\\' || b[7] != 'u' {
			return 0, errEscape
		}
		if r2, ok := hex4(b[8:]); !ok || r2 < 0xdc00 || r2 > 0xdfff {
			return 0, errEscape
		}
		return 12, nil
	}
	return 0, errEscape
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// unescape appends the text of the string contents raw, whose escapes
// str has checked, to dst.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(raw[i+2:])
			if utf16.IsSurrogate(r) {
				r2, _ := hex4(raw[i+8:])
				dst = utf8.AppendRune(dst, utf16.DecodeRune(r, r2))
				i += 12
				continue
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default: // " \ /
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst
}

// number reads a number as RFC 8259 writes it. It works on a local index
// (written back once) because it runs for every number of a body.
func (s *jsonScan) number() error {
	d, i := s.data, s.i
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		i = digits(d, i+1)
	default:
		s.i = i
		return s.errAt("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		j := digits(d, i+1)
		if j == i+1 {
			s.i = j
			return s.errAt("invalid number")
		}
		i = j
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := digits(d, i)
		if j == i {
			s.i = j
			return s.errAt("invalid number")
		}
		i = j
	}
	s.i = i
	return nil
}

// digits returns the index of the first byte from i on that is not a
// decimal digit.
func digits(d []byte, i int) int {
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		i++
	}
	return i
}

// CanonicalNumber writes the JSON number b (valid as RFC 8259 writes it)
// as its value, so that every spelling of one number is one key: 42, 42.0,
// 4.2e1 and 420e-1 are "42". The value is the nearest float64, as
// JavaScript and most JSON parsers read a number: integers are written
// without an exponent ("1e21" is "1000000000000000000000"), others in Go's
// shortest form ("0.5", "1e-07"), and values beyond float64 are "Infinity"
// or "-Infinity". Integers above 2^53 that one float64 holds are one key
// (9007199254740993 is 9007199254740992): an application that reads them
// as floats cannot tell them apart either, and two users merged are safer
// than one user split. The work is linear in len(b) whatever the exponent.
func CanonicalNumber(b []byte) string {
	// Plain integers of up to 15 digits are exact in a float64 and already
	// canonical, except for a negative zero.
	if len(b) <= 15 && plainInt(b) {
		if len(b) == 2 && b[0] == '-' && b[1] == '0' {
			return "0"
		}
		return string(b)
	}
	// strconv reads any number of digits in linear time, keeps what a
	// float64 can hold, and stops counting an exponent past 10,000.
	f, _ := strconv.ParseFloat(string(b), 64)
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0:
		return "0"
	case f == math.Trunc(f):
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func plainInt(b []byte) bool {
	for i, c := range b {
		if (c < '0' || c > '9') && (c != '-' || i != 0) {
			return false
		}
	}
	return len(b) > 0
}
