package keys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Placeholder prefixes of request body fields. Sluice reads the body only
// when a matching zone's key uses one of them.
const (
	BodyJSONPrefix = "http.request.body.json."
	BodyFormPrefix = "http.request.body.form."
)

// ErrAmbiguous is the error of a value the request gives more than once
// (a repeated header, query parameter, cookie, form field, or JSON key):
// the application behind may read another copy than the limiter would.
var ErrAmbiguous = errors.New("ambiguous: given more than once")

// DefaultBodyLimit is how much of a body Sluice reads to find a key field.
const DefaultBodyLimit = 64 << 10

// Body is the head of a request body, read once for every field a request's
// keys need.
type Body struct {
	data     []byte
	ctype    string
	tooLarge bool
	readErr  error
	form     url.Values
	formErr  error
	formDone bool
}

// ReadBody reads up to limit bytes of r's body and puts back a body that
// yields exactly the original bytes, so the next handler sees it unchanged.
// A body larger than limit is not parsed: its fields count as missing.
func ReadBody(r *http.Request, limit int64) *Body {
	b := &Body{ctype: r.Header.Get("Content-Type")}
	if r.Body == nil || r.Body == http.NoBody {
		return b
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	b.data, b.readErr = buf, err
	b.tooLarge = int64(len(buf)) > limit
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf), r.Body), orig: r.Body}
	return b
}

// replayBody returns the bytes already read, then the rest of the original
// body, and closes the original.
type replayBody struct {
	io.Reader
	orig io.ReadCloser
}

func (r *replayBody) Close() error { return r.orig.Close() }

func (b *Body) usable() error {
	switch {
	case b.readErr != nil:
		return fmt.Errorf("reading the body: %w", b.readErr)
	case b.tooLarge:
		return errors.New("body larger than the limit")
	}
	return nil
}

// Field returns the body field behind placeholder name (one of the
// BodyJSONPrefix or BodyFormPrefix names). ok is false when the body is too
// large, is not valid JSON or form data, or lacks the field.
func (b *Body) Field(name string) (string, error) {
	if err := b.usable(); err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(name, BodyJSONPrefix):
		return JSONField(b.data, strings.TrimPrefix(name, BodyJSONPrefix))
	case strings.HasPrefix(name, BodyFormPrefix):
		if !b.formDone {
			b.form, b.formErr = parseForm(b.data, b.ctype)
			b.formDone = true
		}
		if b.formErr != nil {
			return "", fmt.Errorf("body is not form data: %w", b.formErr)
		}
		vals, ok := b.form[strings.TrimPrefix(name, BodyFormPrefix)]
		if !ok || len(vals) == 0 {
			return "", errors.New("form field missing")
		}
		if len(vals) > 1 {
			return "", fmt.Errorf("%w: form field repeated", ErrAmbiguous)
		}
		return vals[0], nil
	}
	return "", fmt.Errorf("not a body placeholder: %s", name)
}

// JSONField returns the scalar at path (dot-separated object keys and
// array indexes: "user.phone", "items.0.id") of the JSON document data.
// The whole document must be valid and the value a string, number or
// boolean. Keys match exactly, or else in another case when that is the
// only spelling present (Go's encoding/json reads "PHONE" into a field
// named phone). No object on the path may hold the key twice, in any mix
// of cases: parsers disagree on which one wins, and the limiter must read
// the same value as the application behind it (ErrAmbiguous).
func JSONField(data []byte, path string) (string, error) {
	if path == "" {
		return "", errors.New("empty JSON path")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	val, found, err := w.value(strings.Split(path, "."))
	if errors.Is(err, ErrAmbiguous) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("body is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("body is not valid JSON: data after the document")
	}
	if !found {
		return "", fmt.Errorf("JSON field %s missing", path)
	}
	return val, nil
}

// walker reads a JSON document token by token, following a path and
// validating everything else.
type walker struct {
	dec   *json.Decoder
	depth int
}

const maxDepth = 64

// value reads one value; when path is empty it is the wanted one. It
// returns the wanted scalar and whether the path was found in this value.
func (w *walker) value(path []string) (string, bool, error) {
	tok, err := w.dec.Token()
	if err != nil {
		return "", false, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if w.depth++; w.depth > maxDepth {
			return "", false, errors.New("nested too deeply")
		}
		defer func() { w.depth-- }()
		if t == '{' {
			return w.object(path)
		}
		return w.array(path)
	case string:
		return t, len(path) == 0, nil
	case json.Number:
		return t.String(), len(path) == 0, nil
	case bool:
		return strconv.FormatBool(t), len(path) == 0, nil
	}
	return "", false, nil // null
}

func (w *walker) object(path []string) (string, bool, error) {
	var val string
	found, seen := false, false
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return "", false, err
		}
		key, _ := tok.(string)
		if len(path) > 0 && strings.EqualFold(key, path[0]) {
			if seen {
				return "", false, fmt.Errorf("%w: key %q repeated", ErrAmbiguous, path[0])
			}
			seen = true
			val, found, err = w.value(path[1:])
		} else {
			_, _, err = w.value(nil)
		}
		if err != nil {
			return "", false, err
		}
	}
	if _, err := w.dec.Token(); err != nil { // '}'
		return "", false, err
	}
	return val, found && len(path) > 0, nil
}

func (w *walker) array(path []string) (string, bool, error) {
	want := -1
	if len(path) > 0 {
		if n, err := strconv.Atoi(path[0]); err == nil && n >= 0 {
			want = n
		}
	}
	var val string
	found := false
	for i := 0; w.dec.More(); i++ {
		var err error
		if i == want {
			val, found, err = w.value(path[1:])
		} else {
			_, _, err = w.value(nil)
		}
		if err != nil {
			return "", false, err
		}
	}
	if _, err := w.dec.Token(); err != nil { // ']'
		return "", false, err
	}
	return val, found, nil
}

// parseForm reads URL-encoded form data, or the text fields of a
// multipart/form-data body (file parts are skipped).
func parseForm(data []byte, ctype string) (url.Values, error) {
	media, params, _ := mime.ParseMediaType(ctype)
	if media != "multipart/form-data" {
		return url.ParseQuery(string(data))
	}
	if params["boundary"] == "" {
		return nil, errors.New("multipart body without a boundary")
	}
	form := url.Values{}
	mr := multipart.NewReader(bytes.NewReader(data), params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return form, nil
		}
		if err != nil {
			return nil, err
		}
		if name := part.FormName(); name != "" && part.FileName() == "" {
			v, err := io.ReadAll(part)
			if err != nil {
				return nil, err
			}
			form.Add(name, string(v))
		}
	}
}
