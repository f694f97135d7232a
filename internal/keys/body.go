package keys

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Placeholder prefixes of request body fields. Sluice reads the body only
// when a matching zone's key or cost uses one of them. The field prefix
// reads a JSON path from a JSON body and a form field from a form, as the
// Content-Type says.
const (
	BodyJSONPrefix  = "http.request.body.json."
	BodyFormPrefix  = "http.request.body.form."
	BodyFieldPrefix = "http.request.body.field."
)

// BodySize is the placeholder of the request body's size in bytes: the
// Content-Length the request declares, else what was read of the body (a
// chunked HTTP/1.1 body, an HTTP/2 body sent without content-length),
// which must then be all of it within the limit. A body larger than the
// limit, one whose reading failed, or one with a Content-Encoding (its
// size decoded is not known) is unreadable: its size is never taken to be
// the limit's, nor what happened to be read.
const BodySize = "http.request.body.size"

// ErrAmbiguous is the error of a value the request gives more than once
// (a repeated header, query parameter, cookie, form field, or JSON key):
// the application behind may read another copy than the limiter would.
var ErrAmbiguous = errors.New("ambiguous: given more than once")

// ErrUnreadable is the error of a body field in a body that cannot be read
// the way the application may read it: a Content-Type that is not the
// placeholder's (or no Content-Type), a charset other than UTF-8, a byte
// order mark, a Content-Encoding, a body over the limit, invalid JSON or
// form data, or an object where a value was wanted. Such a request is
// never skipped: it may carry the field in a form the limiter cannot see.
var ErrUnreadable = errors.New("body unreadable")

// ErrAbsent is the error of a value the request does not have: an empty
// or absent header, query parameter or cookie, or a body field absent
// from a readable body (or null, or no body at all). Only such a key may
// be skipped.
var ErrAbsent = errors.New("absent")

// DefaultBodyLimit is how much of a body Sluice reads to find a key field.
const DefaultBodyLimit = 64 << 10

// bodyPlaceholder splits a body field placeholder into its prefix and the
// path or field it names. ok reports whether name is a body placeholder at
// all: the field may still be empty or malformed, which
// checkBodyPlaceholder refuses.
func bodyPlaceholder(name string) (prefix, field string, ok bool) {
	for _, p := range [...]string{BodyJSONPrefix, BodyFormPrefix, BodyFieldPrefix} {
		if f, found := strings.CutPrefix(name, p); found {
			return p, f, true
		}
	}
	return "", "", false
}

// checkBodyPlaceholder refuses a body placeholder that names no field, or
// a JSON path with an empty segment.
func checkBodyPlaceholder(name string) error {
	prefix, field, ok := bodyPlaceholder(name)
	switch {
	case !ok:
		return nil
	case field == "":
		return fmt.Errorf("placeholder {%s} names no field", name)
	case prefix != BodyFormPrefix && strings.Contains("."+field+".", ".."):
		return fmt.Errorf("placeholder {%s}: the JSON path %q has an empty segment", name, field)
	}
	return nil
}

// BodyFields are the body fields that a handler's keys and costs read,
// collected when it is provisioned so that each body is parsed once per
// request however many limits read it.
type BodyFields struct {
	json JSONPaths
}

// Add records the body fields template reads.
func (f *BodyFields) Add(t Template) {
	for _, name := range t.Placeholders() {
		if prefix, field, ok := bodyPlaceholder(name); ok && prefix != BodyFormPrefix {
			f.json.Add(field)
		}
	}
}

type bodyKind int

const (
	kindOther bodyKind = iota
	kindJSON
	kindURLEncoded
	kindMultipart
)

// Body is the head of a request body, read once for every field a
// request's keys need, and parsed at most once as what its Content-Type
// says it is.
type Body struct {
	data     []byte
	declared int64 // the declared Content-Length, -1 when none
	sizeErr  error // why the body's size is not known
	kind     bodyKind
	media    string // the media type, for messages
	boundary string
	bad      error // why no field of this body can be read
	fields   *BodyFields
	json     []Result
	jsonBuf  [4]Result // json's storage for the usual handful of paths
	form     url.Values
	formErr  error
	formDone bool
}

// ReadBody reads up to limit bytes of r's body and puts back a body that
// yields exactly the original bytes, so the next handler sees it unchanged.
// fields are the JSON paths to find in one pass (others are found on
// demand); it may be nil.
func ReadBody(r *http.Request, limit int64, fields *BodyFields) *Body {
	b := &Body{fields: fields}
	if r.Body != nil && r.Body != http.NoBody {
		b.declared = r.ContentLength
		buf, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		b.data = buf
		r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf), r.Body), orig: r.Body}
		if enc, ok := contentEncoding(r.Header); ok && (len(buf) > 0 || b.declared > 0) {
			b.sizeErr = fmt.Errorf("body has Content-Encoding %q: its size decoded is not known", enc)
		}
		switch {
		case err != nil:
			b.bad = fmt.Errorf("reading the body: %v", err)
		case int64(len(buf)) > limit:
			b.bad = fmt.Errorf("body larger than the limit of %d bytes", limit)
		}
		if b.bad != nil {
			if b.declared < 0 && b.sizeErr == nil {
				b.sizeErr = b.bad
			}
			return b
		}
	}
	if len(b.data) == 0 {
		return b
	}
	b.bad = b.classify(r.Header)
	return b
}

// Size returns the body's size in bytes (see BodySize); its error wraps
// ErrUnreadable when the size is not known.
func (b *Body) Size() (string, error) {
	switch {
	case b.sizeErr != nil:
		return "", fmt.Errorf("%w: %v", ErrUnreadable, b.sizeErr)
	case b.declared > 0:
		return strconv.FormatInt(b.declared, 10), nil
	}
	return strconv.Itoa(len(b.data)), nil
}

// contentEncoding is the first Content-Encoding of h other than identity.
func contentEncoding(h http.Header) (string, bool) {
	for _, enc := range h.Values("Content-Encoding") {
		for e := range strings.SplitSeq(enc, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return e, true
			}
		}
	}
	return "", false
}

// classify sets the kind of body from its headers, or says why it cannot be
// read.
func (b *Body) classify(h http.Header) error {
	if e, ok := contentEncoding(h); ok {
		return fmt.Errorf("body has Content-Encoding %q", e)
	}
	ctypes := h.Values("Content-Type")
	switch len(ctypes) {
	case 0:
		return errors.New("body has no Content-Type")
	case 1:
	default:
		return errors.New("body has more than one Content-Type")
	}
	media, params, err := mime.ParseMediaType(ctypes[0])
	if err != nil {
		return fmt.Errorf("body has an invalid Content-Type %q", ctypes[0])
	}
	b.media = media
	switch {
	case media == "application/json" || strings.HasSuffix(media, "+json"):
		b.kind = kindJSON
	case media == "application/x-www-form-urlencoded":
		b.kind = kindURLEncoded
	case media == "multipart/form-data":
		b.kind = kindMultipart
		if b.boundary = params["boundary"]; b.boundary == "" {
			return errors.New("multipart body without a boundary")
		}
		return nil // each part has its own charset
	default:
		return nil // unreadable for every placeholder, said by Field
	}
	if cs, ok := params["charset"]; ok && !isUTF8(cs) {
		return fmt.Errorf("body has charset %q, not UTF-8", cs)
	}
	return nil
}

// replayBody returns the bytes already read, then the rest of the original
// body, and closes the original.
type replayBody struct {
	io.Reader
	orig io.ReadCloser
}

func (r *replayBody) Close() error { return r.orig.Close() }

// Field returns the body field behind placeholder name (under
// BodyJSONPrefix, BodyFormPrefix or BodyFieldPrefix). Its error wraps
// ErrAbsent when a readable body (or no body) lacks the field,
// ErrAmbiguous when the body gives it twice, and ErrUnreadable when the
// body cannot be read as the placeholder's kind of body.
func (b *Body) Field(name string) (string, error) {
	prefix, field, ok := bodyPlaceholder(name)
	switch {
	case !ok:
		return "", fmt.Errorf("%w: not a body placeholder: %s", ErrUnreadable, name)
	case b.bad != nil:
		return "", fmt.Errorf("%w: %v", ErrUnreadable, b.bad)
	case len(b.data) == 0:
		return "", fmt.Errorf("%w: no body", ErrAbsent)
	}
	isJSON, isForm := b.kind == kindJSON, b.kind == kindURLEncoded || b.kind == kindMultipart
	switch {
	case isJSON && prefix != BodyFormPrefix:
		return b.jsonField(field)
	case isForm && prefix != BodyJSONPrefix:
		return b.formField(field)
	case prefix == BodyJSONPrefix:
		return "", fmt.Errorf("%w: body is %s, not JSON", ErrUnreadable, b.describe())
	case prefix == BodyFormPrefix:
		return "", fmt.Errorf("%w: body is %s, not form data", ErrUnreadable, b.describe())
	}
	return "", fmt.Errorf("%w: body is %s, neither JSON nor form data", ErrUnreadable, b.describe())
}

func (b *Body) describe() string {
	if b.media == "" {
		return "of no type"
	}
	return b.media
}

func (b *Body) jsonField(path string) (string, error) {
	i := -1
	if b.fields != nil {
		i = b.fields.json.index(path)
	}
	if i < 0 {
		return JSONField(b.data, path)
	}
	if b.json == nil {
		b.json = b.fields.json.Extract(b.data, b.jsonBuf[:0])
	}
	return b.json[i].Value, b.json[i].Err
}

func (b *Body) formField(name string) (string, error) {
	if !b.formDone {
		b.form, b.formErr = parseForm(b.data, b.kind, b.boundary)
		b.formDone = true
	}
	if b.formErr != nil {
		return "", fmt.Errorf("%w: body is not valid form data: %v", ErrUnreadable, b.formErr)
	}
	// As for JSON keys, a field in another spelling that an application
	// reads as the field is the field when it is the only spelling, and
	// two spellings are ambiguous.
	var vals []string
	for k, v := range b.form {
		if sameFormName(k, name) {
			vals = append(vals, v...)
		} else if arrayName(k, name) {
			return "", fmt.Errorf("%w: form field %s given as an array (%s)", ErrUnreadable, name, k)
		}
	}
	switch {
	case len(vals) == 0:
		return "", fmt.Errorf("%w: form field %s missing", ErrAbsent, name)
	case len(vals) > 1:
		return "", fmt.Errorf("%w: form field %s repeated", ErrAmbiguous, name)
	case !utf8.ValidString(vals[0]):
		// Applications decode it with replacement characters: many byte
		// strings, one text.
		return "", fmt.Errorf("%w: form field %s is not UTF-8", ErrUnreadable, name)
	}
	return vals[0], nil
}

// sameFormName reports whether an application may read form field a as
// field b: ASP.NET compares names without regard to case, and PHP drops
// leading spaces and reads " ", "." and "[" (unclosed) in a name as "_"
// ($_POST["user_name"] is the field "user.name").
func sameFormName(a, b string) bool {
	a, b = strings.TrimLeft(a, " "), strings.TrimLeft(b, " ")
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if phpUnderscore(ra) != phpUnderscore(rb) && !strings.EqualFold(a[:na], b[:nb]) {
			return false
		}
		a, b = a[na:], b[nb:]
	}
	return a == b
}

// arrayName reports whether an application may read field a as an array
// or object named b: PHP, Rack and Express (qs) read "phone[]" and
// "phone[0]" as the array phone, and JavaScript reads a one-element array
// as its element ("${req.body.phone}" is the number). Such a field is
// never the absent b.
func arrayName(a, b string) bool {
	for i := 1; i < len(a); i++ {
		if a[i] == '[' && strings.IndexByte(a[i:], ']') > 0 && sameFormName(a[:i], b) {
			return true
		}
	}
	return false
}

func phpUnderscore(r rune) rune {
	switch r {
	case ' ', '.', '[':
		return '_'
	}
	return r
}

// parseForm reads URL-encoded form data, or the text fields of a
// multipart/form-data body (file parts are skipped). Anything another
// parser might read differently makes the whole form unreadable: a
// malformed pair, a part that is not form-data or has no name, a
// transfer encoding, a charset other than UTF-8.
func parseForm(data []byte, kind bodyKind, boundary string) (url.Values, error) {
	if kind == kindURLEncoded {
		return url.ParseQuery(string(data))
	}
	form := url.Values{}
	mr := multipart.NewReader(bytes.NewReader(data), boundary)
	for {
		// NextRawPart: NextPart would decode a quoted-printable part,
		// which many applications do not.
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return form, nil
		}
		if err != nil {
			return nil, err
		}
		name, file, err := formPart(part.Header)
		if err != nil {
			return nil, err
		}
		if file {
			continue
		}
		v, err := io.ReadAll(part)
		if err != nil {
			return nil, err
		}
		form.Add(name, string(v))
	}
}

// formPart reads a part's headers: its field name, and whether it is a
// file (a filename parameter, even empty, as browsers send for an empty
// file input).
func formPart(h textproto.MIMEHeader) (name string, file bool, err error) {
	disp := h.Values("Content-Disposition")
	if len(disp) != 1 {
		return "", false, errors.New("a part without exactly one Content-Disposition")
	}
	d, params, err := mime.ParseMediaType(disp[0])
	if err != nil || d != "form-data" || params["name"] == "" || extendedName(disp[0]) {
		return "", false, fmt.Errorf("a part with Content-Disposition %q", disp[0])
	}
	if _, file = params["filename"]; file {
		return params["name"], true, nil
	}
	for _, enc := range h.Values("Content-Transfer-Encoding") {
		switch strings.ToLower(strings.TrimSpace(enc)) {
		case "7bit", "8bit", "binary":
		default:
			return "", false, fmt.Errorf("part %q has Content-Transfer-Encoding %q", params["name"], enc)
		}
	}
	if ct := h.Get("Content-Type"); ct != "" {
		_, p, err := mime.ParseMediaType(ct)
		if cs, ok := p["charset"]; err != nil || ok && !isUTF8(cs) {
			return "", false, fmt.Errorf("part %q has Content-Type %q", params["name"], ct)
		}
	}
	return params["name"], false, nil
}

// extendedName reports whether a Content-Disposition has its name as an
// RFC 2231 parameter (name*=…, name*0=…). Parsers disagree on it: Go's
// mime reads name* over name, Werkzeug the last of the two, busboy only
// name; RFC 7578 does not allow it in form-data. (filename* is common,
// from .NET clients, and every parser reads it as a file.)
func extendedName(v string) bool {
	quoted, start := false, 0
	for i := 0; i <= len(v); i++ {
		switch {
		case i == len(v) || !quoted && v[i] == ';':
			param, _, _ := strings.Cut(v[start:i], "=")
			if p := strings.ToLower(strings.TrimSpace(param)); strings.HasPrefix(p, "name*") {
				return true
			}
			start = i + 1
		case quoted && v[i] == '\\' && i+1 < len(v):
			i++
		case v[i] == '"':
			quoted = !quoted
		}
	}
	return false
}

// isUTF8 reports whether a charset parameter names UTF-8, in the spellings
// clients send ("utf8" is common, and every decoder reads it as UTF-8).
func isUTF8(charset string) bool {
	return strings.EqualFold(charset, "utf-8") || strings.EqualFold(charset, "utf8")
}
