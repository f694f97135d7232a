// Package replay decides the requests of Caddy's JSON access logs again
// through a config's rate_limit handlers, on the memory store driven by the
// log's own timestamps, and measures what it finds: what each zone would
// have denied (simulate), the distribution of each key's rate and the
// limit it suggests (recommend), as text, JSON or one HTML page.
package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Entry is one request of an access log: what Caddy logged of it.
type Entry struct {
	File int   // index of the log file in the command's list
	Line int64 // 1-based line number in that file
	// End is when the request ended (the log's ts) and Arrival when it
	// arrived (ts - duration), in Unix nanoseconds. At is when the replay
	// decides it: Arrival, unless the line came too late for the reorder
	// window (then the time of the request before it).
	End, Arrival, At int64

	Logger                       string
	Method, Host, URI, Proto     string
	RemoteIP, RemotePort, Client string
	Header                       http.Header
	TLS                          *TLSInfo
	UserID                       string
	Status                       int
	// respRaw is the logged response header fields, decoded only for a
	// limit that reads them (RespHeader).
	respRaw json.RawMessage
}

// RespHeader is the response header fields the log has.
func (e *Entry) RespHeader() http.Header {
	var h http.Header
	if len(e.respRaw) > 0 {
		_ = json.Unmarshal(e.respRaw, &h)
	}
	return h
}

// hasRespHeader tells whether the logged response has the field name
// (canonical, as the log writes it).
func (e *Entry) hasRespHeader(name string) bool {
	return bytes.Contains(e.respRaw, []byte(`"`+name+`"`))
}

// TLSInfo is what the access log says of a request's TLS connection.
type TLSInfo struct {
	Version     uint16 `json:"version"`
	CipherSuite uint16 `json:"cipher_suite"`
	Proto       string `json:"proto"`
	ServerName  string `json:"server_name"`
}

// rawEntry is the JSON of one access log line. ts and duration are kept
// as numbers in their decimal form, read exactly to the nanosecond.
type rawEntry struct {
	Logger      string          `json:"logger"`
	TS          json.RawMessage `json:"ts"`
	Duration    json.RawMessage `json:"duration"`
	Request     *rawRequest     `json:"request"`
	UserID      string          `json:"user_id"`
	Status      int             `json:"status"`
	RespHeaders json.RawMessage `json:"resp_headers"`
}

type rawRequest struct {
	RemoteIP   string      `json:"remote_ip"`
	RemotePort string      `json:"remote_port"`
	ClientIP   string      `json:"client_ip"`
	Proto      string      `json:"proto"`
	Method     string      `json:"method"`
	Host       string      `json:"host"`
	URI        string      `json:"uri"`
	Headers    http.Header `json:"headers"`
	TLS        *TLSInfo    `json:"tls"`
}

// accessLogger is the logger name prefix of Caddy's access logs.
const accessLogger = "http.log.access"

// errNotAccess marks a JSON line of another logger: skipped, not malformed.
var errNotAccess = errors.New("not an access log entry")

// parseEntry reads one line into e, with sc (nil: encoding/json alone).
func parseEntry(sc *scanner, line []byte, e *Entry) error {
	var raw rawEntry
	if sc == nil || sc.scanEntry(line, &raw) != nil {
		raw = rawEntry{}
		if err := json.Unmarshal(line, &raw); err != nil {
			return fmt.Errorf("not JSON: %v", err)
		}
	}
	if raw.Logger != accessLogger && !strings.HasPrefix(raw.Logger, accessLogger+".") {
		return errNotAccess
	}
	if raw.Request == nil {
		return errors.New("no request object")
	}
	end, err := parseTS(raw.TS)
	if err != nil {
		return fmt.Errorf("ts: %v", err)
	}
	dur, err := parseDuration(raw.Duration)
	if err != nil {
		return fmt.Errorf("duration: %v", err)
	}
	q := raw.Request
	if q.Method == "" || q.URI == "" {
		return errors.New("request without method or uri")
	}
	*e = Entry{
		File: e.File, Line: e.Line,
		End: end, Arrival: end - dur,
		Logger: raw.Logger, Method: q.Method, Host: q.Host, URI: q.URI, Proto: q.Proto,
		RemoteIP: q.RemoteIP, RemotePort: q.RemotePort, Client: q.ClientIP,
		Header: q.Headers, TLS: q.TLS, UserID: raw.UserID,
		Status: raw.Status, respRaw: raw.RespHeaders,
	}
	if e.Header == nil {
		e.Header = http.Header{}
	}
	e.At = e.Arrival
	return nil
}

// parseTS reads Caddy's ts: Unix seconds as a decimal number (the json
// encoder's default), exactly; or an RFC 3339 / ISO 8601 string for a log
// whose time_format was changed.
func parseTS(b json.RawMessage) (int64, error) {
	if len(b) == 0 {
		return 0, errors.New("missing")
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return 0, err
		}
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.000Z0700", "2006/01/02 15:04:05.000"} {
			if t, err := time.Parse(layout, s); err == nil {
				return t.UnixNano(), nil
			}
		}
		return 0, fmt.Errorf("cannot read time %q", s)
	}
	return decimalNanos(string(b))
}

// parseDuration reads Caddy's duration: seconds as a decimal number (the
// default duration_format), or a Go duration string ("1.5ms").
func parseDuration(b json.RawMessage) (int64, error) {
	if len(b) == 0 {
		return 0, nil // no duration: the request took no time
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return 0, err
		}
		d, err := time.ParseDuration(s)
		return int64(d), err
	}
	d, err := decimalNanos(string(b))
	if err == nil && d < 0 {
		err = errors.New("negative")
	}
	return d, err
}

// decimalNanos reads a decimal number of seconds as nanoseconds without
// going through a float (whose 53 bits lose the microseconds of a Unix
// time).
func decimalNanos(s string) (int64, error) {
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, err
		}
		return int64(f * 1e9), nil
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec > 1<<33 {
		return 0, fmt.Errorf("cannot read %q as seconds", s)
	}
	if len(frac) > 9 {
		frac = frac[:9]
	}
	var ns int64
	if frac != "" {
		n, err := strconv.ParseInt(frac, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot read %q as seconds", s)
		}
		for i := len(frac); i < 9; i++ {
			n *= 10
		}
		ns = n
	}
	v := sec*1e9 + ns
	if neg {
		v = -v
	}
	return v, nil
}

// Malformed is a line that could not be read, with where it is.
type Malformed struct {
	File  string `json:"file"`
	Line  int64  `json:"line"`
	Error string `json:"error"`
}

// FormatError refuses a file that is not a JSON access log at all.
type FormatError struct {
	File string
	Line int64
	Why  string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s:%d: %s; expected Caddy's JSON access log: one JSON object a line with a \"request\", as Caddy writes with `log { output file …; format json }` (gzip-compressed files are read too)", e.File, e.Line, e.Why)
}

// maxLine is the longest line read; a longer one is malformed (an access
// line with every header of a browser is a few KiB).
const maxLine = 1 << 20

// source reads one log file. A goroutine reads its lines in batches,
// parse workers decode the batches in parallel, and next hands out their
// entries in the file's order.
type source struct {
	name    string
	index   int
	ordered chan *job // batches in the file's order
	head    []*Entry  // the batch being taken from
	err     error     // a FormatError or a read error, once done
	done    bool
	stats   sourceStats
}

// job is one batch of lines, parsed by a worker.
type job struct {
	first  int64    // line number of lines[0]
	lines  [][]byte // nil for blank lines
	buf    []byte
	err    error // of the reader, after the lines
	parsed chan struct{}
	out    []*Entry
	lines1 int64 // lines that are not blank
	other  int64
	bad    []Malformed
}

// sourceStats count a file's lines; kept by the goroutine calling next.
type sourceStats struct {
	lines, entries, other int64
	malformed             []Malformed // the first few, in order
	malformedN            int64
}

const keepMalformed = 20

const batchSize = 512

// parseWorkers is how many goroutines decode a file's lines: decoding is
// most of a replay's work, and the replay itself takes one core more.
var parseWorkers = max(runtime.GOMAXPROCS(0), 2)

func openSource(name string, index int) (*source, error) {
	var r io.ReadCloser
	if name == "-" {
		r = io.NopCloser(os.Stdin)
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		r = f
	}
	s := &source{name: name, index: index, ordered: make(chan *job, 4*parseWorkers)}
	jobs := make(chan *job, 4*parseWorkers)
	for range parseWorkers {
		go func() {
			sc := &scanner{intern: map[string]string{}}
			for j := range jobs {
				j.parse(sc, s.name, s.index)
				close(j.parsed)
			}
		}()
	}
	go s.read(r, jobs)
	return s, nil
}

func (j *job) parse(sc *scanner, name string, index int) {
	for i, line := range j.lines {
		if line == nil {
			continue
		}
		j.lines1++
		n := j.first + int64(i)
		if len(line) > maxLine {
			j.bad = append(j.bad, Malformed{File: name, Line: n, Error: "line longer than 1 MiB"})
			continue
		}
		e := &Entry{File: index, Line: n}
		switch err := parseEntry(sc, line, e); {
		case err == nil:
			j.out = append(j.out, e)
		case err == errNotAccess:
			j.other++
		default:
			j.bad = append(j.bad, Malformed{File: name, Line: n, Error: err.Error()})
		}
	}
	j.lines, j.buf = nil, nil
}

// read splits the file into batches of lines.
func (s *source) read(rc io.ReadCloser, jobs chan<- *job) {
	defer close(s.ordered)
	defer close(jobs)
	defer rc.Close()
	send := func(j *job) {
		j.parsed = make(chan struct{})
		if len(j.lines) == 0 {
			close(j.parsed)
		} else {
			jobs <- j
		}
		s.ordered <- j
	}
	fail := func(err error) {
		j := &job{err: err}
		j.parsed = make(chan struct{})
		close(j.parsed)
		s.ordered <- j
	}
	br := bufio.NewReaderSize(rc, 256<<10)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			fail(fmt.Errorf("%s: %v", s.name, err))
			return
		}
		defer zr.Close()
		rd = zr
	}
	lr := bufio.NewReaderSize(rd, 256<<10)
	var n int64
	seenFirst := false
	j := &job{first: 1, lines: make([][]byte, 0, batchSize)}
	var long []byte
	for {
		line, err := lr.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], line...)
			for err == bufio.ErrBufferFull {
				line, err = lr.ReadSlice('\n')
				if len(long) <= maxLine {
					long = append(long, line...)
				}
			}
			line = long
		}
		if len(line) > 0 {
			n++
			trimmed := bytes.TrimSpace(line)
			if len(trimmed) > 0 && !seenFirst {
				seenFirst = true
				if why := notJSONLog(trimmed); why != "" {
					fail(&FormatError{File: s.name, Line: n, Why: why})
					return
				}
			}
			if len(trimmed) == 0 {
				j.lines = append(j.lines, nil)
			} else {
				off := len(j.buf)
				j.buf = append(j.buf, trimmed...)
				j.lines = append(j.lines, j.buf[off:len(j.buf):len(j.buf)])
			}
			if len(j.lines) == batchSize {
				// The lines point into j.buf (and entries keep their
				// response fields there): a new batch gets a new buffer,
				// sized after this one's so that it rarely grows.
				used := len(j.buf)
				send(j)
				j = &job{first: n + 1, buf: make([]byte, 0, used+used/8), lines: make([][]byte, 0, batchSize)}
			}
		}
		if err != nil {
			if err != io.EOF {
				j.err = fmt.Errorf("%s: line %d: %v", s.name, n+1, err)
			}
			send(j)
			return
		}
	}
}

// next is the source's next entry, nil at its end.
func (s *source) next() (*Entry, error) {
	for len(s.head) == 0 {
		if s.done {
			return nil, s.err
		}
		j, ok := <-s.ordered
		if !ok {
			s.done = true
			if s.err == nil && s.stats.entries == 0 && s.stats.other > 0 && s.stats.malformedN == 0 {
				s.err = &FormatError{File: s.name, Line: 1, Why: fmt.Sprintf("no access log entry (logger %s…) in %d lines of other loggers", accessLogger, s.stats.other)}
			}
			return nil, s.err
		}
		<-j.parsed
		s.stats.lines += j.lines1
		s.stats.entries += int64(len(j.out))
		s.stats.other += j.other
		for _, m := range j.bad {
			s.stats.malformedN++
			if len(s.stats.malformed) < keepMalformed {
				s.stats.malformed = append(s.stats.malformed, m)
			}
		}
		if j.err != nil {
			s.err = j.err
			s.done = true
			go func() {
				for range s.ordered {
				}
			}()
			if _, ok := j.err.(*FormatError); ok {
				return nil, j.err
			}
		}
		s.head = j.out
	}
	e := s.head[0]
	s.head = s.head[1:]
	return e, nil
}

// notJSONLog tells why the first line of a file shows it is no JSON log,
// or "".
func notJSONLog(line []byte) string {
	if line[0] == '{' {
		return ""
	}
	if bytes.Contains(line, []byte("\t"+accessLogger)) {
		return "this is Caddy's console log format; set `format json` in the log block"
	}
	if len(line) > 60 {
		line = line[:60]
	}
	return fmt.Sprintf("line 1 is not a JSON object (it starts %q)", line)
}

// Merger hands out the entries of several logs in order of arrival. Each
// file is in order of ts (when requests ended), give or take the requests
// logged at the same moment; a request's arrival is ts - duration, so a
// slow one is logged long after later arrivals. Entries wait in a heap
// until no file can still hold an earlier arrival, assuming no request
// took longer than the reorder window; one that did comes late and is
// decided at the time of the request before it (counted in Late).
type Merger struct {
	sources []*source
	heads   []*Entry
	window  int64
	maxHeld int
	held    entryHeap
	last    int64
	started bool

	// Late counts the entries decided after a later arrival.
	Late    int64
	Longest int64 // the longest duration of a late entry, ns
}

// DefaultReorder is how long a request may take and still be replayed
// exactly in order of arrival.
const DefaultReorder = 10 * time.Second

// maxHeld caps the entries waiting in the heap: past it the earliest goes,
// whatever the window, so that memory stays bounded on any log.
const maxHeld = 1 << 20

// NewMerger opens the files; "-" is standard input.
func NewMerger(files []string, window time.Duration) (*Merger, error) {
	if window <= 0 {
		window = DefaultReorder
	}
	m := &Merger{window: int64(window), maxHeld: maxHeld}
	for i, f := range files {
		s, err := openSource(f, i)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.sources = append(m.sources, s)
	}
	m.heads = make([]*Entry, len(m.sources))
	return m, nil
}

// Close stops reading every file.
func (m *Merger) Close() {
	for _, s := range m.sources {
		if !s.done {
			s.done = true
			go func() {
				for range s.ordered {
				}
			}()
		}
	}
}

// Next returns the next entry in order of arrival, or nil at the end.
func (m *Merger) Next() (*Entry, error) {
	if !m.started {
		m.started = true
		for i, s := range m.sources {
			e, err := s.next()
			if err != nil {
				return nil, err
			}
			m.heads[i] = e
		}
	}
	for {
		// Read from the file whose next line ended earliest, so that
		// every file advances together.
		lo := -1
		for i, e := range m.heads {
			if e != nil && (lo < 0 || e.End < m.heads[lo].End) {
				lo = i
			}
		}
		if len(m.held) > 0 && (lo < 0 || m.held[0].Arrival <= m.heads[lo].End-m.window || len(m.held) >= m.maxHeld) {
			return m.emit(heap.Pop(&m.held).(*Entry)), nil
		}
		if lo < 0 {
			return nil, nil
		}
		heap.Push(&m.held, m.heads[lo])
		e, err := m.sources[lo].next()
		if err != nil {
			return nil, err
		}
		m.heads[lo] = e
	}
}

func (m *Merger) emit(e *Entry) *Entry {
	e.At = e.Arrival
	if e.At < m.last {
		m.Late++
		m.Longest = max(m.Longest, e.End-e.Arrival)
		e.At = m.last
	}
	m.last = e.At
	return e
}

// Files are the names of the files read.
func (m *Merger) Files() []string {
	names := make([]string, len(m.sources))
	for i, s := range m.sources {
		names[i] = s.name
	}
	return names
}

// Counts are the merged files' line counts, once Next returned nil.
func (m *Merger) Counts() (lines, entries, other, malformed int64, examples []Malformed) {
	for _, s := range m.sources {
		lines += s.stats.lines
		entries += s.stats.entries
		other += s.stats.other
		malformed += s.stats.malformedN
		examples = append(examples, s.stats.malformed...)
	}
	if len(examples) > keepMalformed {
		examples = examples[:keepMalformed]
	}
	return
}

// entryHeap orders entries by arrival, then file and line.
type entryHeap []*Entry

func (h entryHeap) Len() int { return len(h) }
func (h entryHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.Arrival != b.Arrival {
		return a.Arrival < b.Arrival
	}
	if a.File != b.File {
		return a.File < b.File
	}
	return a.Line < b.Line
}
func (h entryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *entryHeap) Push(x any)   { *h = append(*h, x.(*Entry)) }
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
