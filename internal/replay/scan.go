package replay

import (
	"errors"
	"net/http"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A hand-written reader of Caddy's access log lines: encoding/json's
// reflection over the headers map was four fifths of a replay's time. It
// reads the fields a replay needs and steps over the rest; a line it
// cannot read goes to encoding/json, whose error is the one reported.

var errSyntax = errors.New("syntax")

type scanner struct {
	b      []byte
	i      int
	intern map[string]string // header names and common values, per worker
}

// maxInterned bounds a worker's interned strings.
const maxInterned = 8192

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != c {
		return errSyntax
	}
	s.i++
	return nil
}

// rawString returns the bytes between the quotes and whether they hold
// escapes.
func (s *scanner) rawString() ([]byte, bool, error) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, errSyntax
	}
	s.i++
	start, esc := s.i, false
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			raw := s.b[start:s.i]
			s.i++
			return raw, esc, nil
		case '\\':
			esc = true
			s.i += 2
			continue
		}
		s.i++
	}
	return nil, false, errSyntax
}

func (s *scanner) str() (string, error) {
	raw, esc, err := s.rawString()
	if err != nil {
		return "", err
	}
	if !esc {
		return string(raw), nil
	}
	return unescape(raw)
}

// internedStr is str, returning one copy of each value seen before.
func (s *scanner) internedStr() (string, error) {
	raw, esc, err := s.rawString()
	if err != nil {
		return "", err
	}
	if esc {
		return unescape(raw)
	}
	if v, ok := s.intern[string(raw)]; ok {
		return v, nil
	}
	v := string(raw)
	if len(s.intern) < maxInterned && len(v) <= 256 {
		s.intern[v] = v
	}
	return v, nil
}

func unescape(raw []byte) (string, error) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", errSyntax
		}
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+4 >= len(raw) {
				return "", errSyntax
			}
			r, err := strconv.ParseUint(string(raw[i+1:i+5]), 16, 16)
			if err != nil {
				return "", errSyntax
			}
			i += 4
			ru := rune(r)
			if utf16.IsSurrogate(ru) && i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if r2, err := strconv.ParseUint(string(raw[i+3:i+7]), 16, 16); err == nil {
					if d := utf16.DecodeRune(ru, rune(r2)); d != utf8.RuneError {
						ru = d
						i += 6
					}
				}
			}
			out = utf8.AppendRune(out, ru)
		default:
			return "", errSyntax
		}
	}
	return string(out), nil
}

// value returns the bytes of the next value, stepping over it.
func (s *scanner) value() ([]byte, error) {
	s.ws()
	if s.i >= len(s.b) {
		return nil, errSyntax
	}
	start := s.i
	switch c := s.b[s.i]; c {
	case '"':
		if _, _, err := s.rawString(); err != nil {
			return nil, err
		}
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, _, err := s.rawString(); err != nil {
					return nil, err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return s.b[start:s.i], nil
				}
			}
			s.i++
		}
		return nil, errSyntax
	default:
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				if s.i == start {
					return nil, errSyntax
				}
				return s.b[start:s.i], nil
			}
			s.i++
		}
		if s.i == start {
			return nil, errSyntax
		}
	}
	return s.b[start:s.i], nil
}

// object calls field for each key of an object; field reads the value.
func (s *scanner) object(field func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		key, esc, err := s.rawString()
		if err != nil {
			return err
		}
		if esc {
			k, err := unescape(key)
			if err != nil {
				return err
			}
			key = []byte(k)
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errSyntax
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}

func (s *scanner) skip() error { _, err := s.value(); return err }

func (s *scanner) header() (http.Header, error) {
	h := http.Header{}
	err := s.object(func(key []byte) error {
		name, ok := s.intern[string(key)]
		if !ok {
			name = string(key)
			if len(s.intern) < maxInterned {
				s.intern[name] = name
			}
		}
		if err := s.expect('['); err != nil {
			return err
		}
		var vals []string
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			h[name] = vals
			return nil
		}
		for {
			v, err := s.internedStr()
			if err != nil {
				return err
			}
			vals = append(vals, v)
			s.ws()
			if s.i >= len(s.b) {
				return errSyntax
			}
			if s.b[s.i] == ']' {
				s.i++
				break
			}
			if s.b[s.i] != ',' {
				return errSyntax
			}
			s.i++
		}
		h[name] = vals
		return nil
	})
	return h, err
}

// scanEntry reads line into raw, as encoding/json would.
func (s *scanner) scanEntry(line []byte, raw *rawEntry) error {
	s.b, s.i = line, 0
	err := s.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "logger":
			raw.Logger, err = s.internedStr()
		case "ts":
			raw.TS, err = s.value()
		case "duration":
			raw.Duration, err = s.value()
		case "user_id":
			raw.UserID, err = s.internedStr()
		case "status":
			var v []byte
			if v, err = s.value(); err == nil {
				raw.Status, err = strconv.Atoi(string(v))
			}
		case "resp_headers":
			raw.RespHeaders, err = s.value()
		case "request":
			raw.Request = new(rawRequest)
			err = s.request(raw.Request)
		default:
			err = s.skip()
		}
		return err
	})
	if err == nil {
		s.ws()
		if s.i != len(s.b) {
			err = errSyntax
		}
	}
	return err
}

func (s *scanner) request(q *rawRequest) error {
	return s.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "remote_ip":
			q.RemoteIP, err = s.internedStr()
		case "remote_port":
			q.RemotePort, err = s.str()
		case "client_ip":
			q.ClientIP, err = s.internedStr()
		case "proto":
			q.Proto, err = s.internedStr()
		case "method":
			q.Method, err = s.internedStr()
		case "host":
			q.Host, err = s.internedStr()
		case "uri":
			q.URI, err = s.str()
		case "headers":
			q.Headers, err = s.header()
		case "tls":
			q.TLS = new(TLSInfo)
			err = s.object(func(key []byte) error {
				var err error
				switch string(key) {
				case "version", "cipher_suite":
					var v []byte
					var n uint64
					if v, err = s.value(); err == nil {
						n, err = strconv.ParseUint(string(v), 10, 16)
					}
					if string(key) == "version" {
						q.TLS.Version = uint16(n)
					} else {
						q.TLS.CipherSuite = uint16(n)
					}
				case "proto":
					q.TLS.Proto, err = s.internedStr()
				case "server_name":
					q.TLS.ServerName, err = s.internedStr()
				default:
					err = s.skip()
				}
				return err
			})
		default:
			err = s.skip()
		}
		return err
	})
}
