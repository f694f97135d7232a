package keys

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
)

// newBody reads body with the given headers, as the handler would.
func newBody(t *testing.T, body string, header ...string) *Body {
	t.Helper()
	r, _ := http.NewRequest("POST", "/", strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return ReadBody(r, 1024, nil)
}

func multipartForm(t *testing.T, parts ...func(*multipart.Writer)) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, p := range parts {
		p(w)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String(), w.FormDataContentType()
}

func field(name, value string) func(*multipart.Writer) {
	return func(w *multipart.Writer) { _ = w.WriteField(name, value) }
}

func rawPart(header textproto.MIMEHeader, value string) func(*multipart.Writer) {
	return func(w *multipart.Writer) {
		pw, _ := w.CreatePart(header)
		_, _ = pw.Write([]byte(value))
	}
}

// The Content-Type decides the parser: each placeholder reads only its
// kind of body, and a body of another kind is unreadable, never absent.
func TestBodyFieldByContentType(t *testing.T) {
	const (
		js   = "application/json"
		form = "application/x-www-form-urlencoded"
	)
	smuggled := `{"phone":"01712000001","x":"&phone=01712345678&"}`
	mp, mpType := multipartForm(t, field("phone", "01712345678"))
	tests := []struct {
		name, body string
		header     []string
		field      string
		want       string
		err        error
	}{
		{"JSON", `{"phone":"1"}`, []string{"Content-Type", js}, BodyJSONPrefix + "phone", "1", nil},
		{"JSON, case and charset", `{"phone":"1"}`, []string{"Content-Type", "Application/JSON; Charset=\"UTF-8\""}, BodyJSONPrefix + "phone", "1", nil},
		{"+json", `{"phone":"1"}`, []string{"Content-Type", "application/vnd.api+json"}, BodyJSONPrefix + "phone", "1", nil},
		{"problem+json", `{"phone":"1"}`, []string{"Content-Type", "application/problem+JSON"}, BodyJSONPrefix + "phone", "1", nil},
		{"JSON sent as a form", smuggled, []string{"Content-Type", form}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"form sent as JSON", smuggled, []string{"Content-Type", js}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"smuggled form read as a form", smuggled, []string{"Content-Type", form}, BodyFormPrefix + "phone", "01712345678", nil},
		{"text/plain JSON", `{"phone":"1"}`, []string{"Content-Type", "text/plain"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"text/plain form", `phone=1`, []string{"Content-Type", "text/plain"}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"text/plain field", `phone=1`, []string{"Content-Type", "text/plain"}, BodyFieldPrefix + "phone", "", ErrUnreadable},
		{"no Content-Type", `{"phone":"1"}`, nil, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"two Content-Types", `{"phone":"1"}`, []string{"Content-Type", js, "Content-Type", js}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"malformed Content-Type", `{"phone":"1"}`, []string{"Content-Type", "application/json; charset"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"latin1", `{"phone":"1"}`, []string{"Content-Type", "application/json; charset=iso-8859-1"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"utf-16", `{"phone":"1"}`, []string{"Content-Type", "application/json; charset=utf-16"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"form latin1", `phone=1`, []string{"Content-Type", form + "; charset=latin1"}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"gzip", `{"phone":"1"}`, []string{"Content-Type", js, "Content-Encoding", "gzip"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"identity", `{"phone":"1"}`, []string{"Content-Type", js, "Content-Encoding", "Identity"}, BodyJSONPrefix + "phone", "1", nil},
		{"gzip after identity", `{"phone":"1"}`, []string{"Content-Type", js, "Content-Encoding", "identity, gzip"}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"BOM", "\uFEFF" + `{"phone":"1"}`, []string{"Content-Type", js}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"over the limit", `{"phone":"1","pad":"` + strings.Repeat("x", 1024) + `"}`, []string{"Content-Type", js}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"no body", ``, []string{"Content-Type", js}, BodyJSONPrefix + "phone", "", ErrAbsent},
		{"no body, no type", ``, nil, BodyFieldPrefix + "phone", "", ErrAbsent},
		{"absent from JSON", `{"email":"a@b.co"}`, []string{"Content-Type", js}, BodyJSONPrefix + "phone", "", ErrAbsent},
		{"absent from form", `email=a@b.co`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrAbsent},
		{"field, JSON", `{"user":{"phone":"1"}}`, []string{"Content-Type", js}, BodyFieldPrefix + "user.phone", "1", nil},
		{"field, form", `user.phone=2`, []string{"Content-Type", form}, BodyFieldPrefix + "user.phone", "2", nil},
		{"field, multipart", mp, []string{"Content-Type", mpType}, BodyFieldPrefix + "phone", "01712345678", nil},
		{"form, multipart", mp, []string{"Content-Type", mpType}, BodyFormPrefix + "phone", "01712345678", nil},
		{"JSON, multipart", mp, []string{"Content-Type", mpType}, BodyJSONPrefix + "phone", "", ErrUnreadable},
		{"multipart without boundary", mp, []string{"Content-Type", "multipart/form-data"}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"multipart, wrong boundary", mp, []string{"Content-Type", "multipart/form-data; boundary=nope"}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form repeated", `phone=1&phone=2`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrAmbiguous},
		{"form repeated, encoded", `phone=1&ph%6Fne=2`, []string{"Content-Type", form}, BodyFieldPrefix + "phone", "", ErrAmbiguous},
		{"form semicolon", `phone=1;phone=2`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form bad escape", `phone=%zz`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form invalid UTF-8", `phone=1%FF`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form plus is space", `phone=a+b`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "a b", nil},
		{"form, only spelling in another case", `PHONE=1`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "1", nil},
		{"form, two cases", `PHONE=1&phone=2`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrAmbiguous},
		{"form, PHP's spelling", `user.name=1`, []string{"Content-Type", form}, BodyFormPrefix + "user_name", "1", nil},
		{"form, two PHP spellings", `user_name=1&user+name=2`, []string{"Content-Type", form}, BodyFormPrefix + "user_name", "", ErrAmbiguous},
		{"form, leading space", `+user_name=1&user_name=2`, []string{"Content-Type", form}, BodyFormPrefix + "user_name", "", ErrAmbiguous},
		{"form, unclosed bracket", `user[name=1&user_name=2`, []string{"Content-Type", form}, BodyFieldPrefix + "user_name", "", ErrAmbiguous},
		{"form, another name", `username=1&user_name2=2`, []string{"Content-Type", form}, BodyFormPrefix + "user_name", "", ErrAbsent},
		// PHP, Rack and qs read these as the array phone; JavaScript reads
		// a one-element array as its element.
		{"form, array", `phone[]=1`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form, indexed", `phone[0]=1`, []string{"Content-Type", form}, BodyFieldPrefix + "phone", "", ErrUnreadable},
		{"form, encoded brackets", `phone%5B%5D=1`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form, array and value", `phone=1&PHONE[]=2`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrUnreadable},
		{"form, nested field", `user[name]=1`, []string{"Content-Type", form}, BodyFormPrefix + "user[name]", "1", nil},
		{"form, nested array", `user[name][]=1`, []string{"Content-Type", form}, BodyFormPrefix + "user[name]", "", ErrUnreadable},
		{"form, bracket in another name", `phones[]=1&x[phone]=2`, []string{"Content-Type", form}, BodyFormPrefix + "phone", "", ErrAbsent},
		{"JSON, two cases", `{"phone":"1","Phone":"2"}`, []string{"Content-Type", js}, BodyFieldPrefix + "phone", "", ErrAmbiguous},
		{"JSON null", `{"phone":null}`, []string{"Content-Type", js}, BodyFieldPrefix + "phone", "", ErrAbsent},
		{"JSON number", `{"phone":4.2e1}`, []string{"Content-Type", js}, BodyFieldPrefix + "phone", "42", nil},
	}
	for _, tt := range tests {
		got, err := newBody(t, tt.body, tt.header...).Field(tt.field)
		if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

// Multipart parts that another parser may read differently make the form
// unreadable; file parts are not fields.
func TestMultipartParts(t *testing.T) {
	hdr := func(kv ...string) textproto.MIMEHeader {
		h := textproto.MIMEHeader{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	cd := "Content-Disposition"
	tests := []struct {
		name string
		part func(*multipart.Writer)
		want string
		err  error
	}{
		{"text field", field("username", "rakib"), "rakib", nil},
		{"utf-8 part", rawPart(hdr(cd, `form-data; name="username"`, "Content-Type", "text/plain; charset=UTF-8"), "rakib"), "rakib", nil},
		{"file part", rawPart(hdr(cd, `form-data; name="username"; filename="a.txt"`), "rakib"), "", ErrAbsent},
		{"empty file name", rawPart(hdr(cd, `form-data; name="username"; filename=""`), "rakib"), "", ErrAbsent},
		{"quoted-printable", rawPart(hdr(cd, `form-data; name="username"`, "Content-Transfer-Encoding", "quoted-printable"), "r=61kib"), "", ErrUnreadable},
		{"base64", rawPart(hdr(cd, `form-data; name="username"`, "Content-Transfer-Encoding", "base64"), "cmFraWI="), "", ErrUnreadable},
		{"8bit", rawPart(hdr(cd, `form-data; name="username"`, "Content-Transfer-Encoding", "8bit"), "rakib"), "rakib", nil},
		{"latin1 part", rawPart(hdr(cd, `form-data; name="username"`, "Content-Type", "text/plain; charset=latin1"), "rakib"), "", ErrUnreadable},
		{"attachment", rawPart(hdr(cd, `attachment; name="username"`), "rakib"), "", ErrUnreadable},
		{"no name", rawPart(hdr(cd, `form-data`), "rakib"), "", ErrUnreadable},
		{"no disposition", rawPart(hdr("X-Other", "1"), "rakib"), "", ErrUnreadable},
		{"two dispositions", rawPart(hdr(cd, `form-data; name="username"`, cd, `form-data; name="other"`), "rakib"), "", ErrUnreadable},
		// Go reads name*, Werkzeug the last, busboy name: another field to each.
		{"extended name after", rawPart(hdr(cd, `form-data; name="username"; name*=UTF-8''junk`), "rakib"), "", ErrUnreadable},
		{"extended name before", rawPart(hdr(cd, `form-data; NAME*=UTF-8''junk; name="username"`), "rakib"), "", ErrUnreadable},
		{"extended name alone", rawPart(hdr(cd, `form-data; name*=UTF-8''username`), "rakib"), "", ErrUnreadable},
		{"name continuation", rawPart(hdr(cd, `form-data; name*0="user"; name*1="name"`), "rakib"), "", ErrUnreadable},
		{"star in a quoted name", rawPart(hdr(cd, `form-data; name="username"; x="a;name*=b"`), "rakib"), "rakib", nil},
		{"extended file name", rawPart(hdr(cd, `form-data; name="username"; filename*=UTF-8''a.txt`), "rakib"), "", ErrAbsent},
	}
	for _, tt := range tests {
		body, ctype := multipartForm(t, field("password", "x"), tt.part)
		got, err := newBody(t, body, "Content-Type", ctype).Field(BodyFieldPrefix + "username")
		if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
	body, ctype := multipartForm(t, field("username", "a"), field("username", "b"))
	if _, err := newBody(t, body, "Content-Type", ctype).Field(BodyFormPrefix + "username"); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("repeated multipart field: %v", err)
	}
}

// The body is read once, bounded, and handed on byte for byte, whether it
// was fully read, larger than the limit, or not parsed at all.
func TestReadBodyPassesThrough(t *testing.T) {
	big := make([]byte, 3*DefaultBodyLimit)
	_, _ = rand.Read(big)
	mp, mpType := multipartForm(t, field("username", "Rakib"), func(w *multipart.Writer) {
		fw, _ := w.CreateFormFile("avatar", "a.png")
		_, _ = fw.Write([]byte("username=ignored"))
	})
	for _, tt := range []struct{ ctype, body string }{
		{"", ""},
		{"application/json", `{"phone":"01712345678"}`},
		{"application/x-www-form-urlencoded", "email=a%40b.co&x=1"},
		{mpType, mp},
		{"application/json", string(big)},
		{"application/octet-stream", string(big)},
	} {
		r, _ := http.NewRequest("POST", "/", strings.NewReader(tt.body))
		r.Header.Set("Content-Type", tt.ctype)
		b := ReadBody(r, DefaultBodyLimit, nil)
		_, _ = b.Field(BodyJSONPrefix + "phone")
		_, _ = b.Field(BodyFieldPrefix + "username")
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, []byte(tt.body)) {
			t.Fatalf("body of %d bytes came out as %d bytes (%v)", len(tt.body), len(got), err)
		}
		if err := r.Body.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A body is parsed once for all the fields a handler declared, however
// many limits read them.
func TestBodyParsedOnce(t *testing.T) {
	var fields BodyFields
	for _, s := range []string{"{http.request.body.json.phone}", "{http.request.body.field.user.id}:{http.request.body.json.n}", "{http.request.body.form.x}"} {
		tmpl, err := ParseTemplate(s)
		if err != nil {
			t.Fatal(err)
		}
		fields.Add(tmpl)
	}
	if fields.json.Len() != 3 {
		t.Fatalf("%d JSON paths, want 3 (phone, user.id, n)", fields.json.Len())
	}
	r, _ := http.NewRequest("POST", "/", strings.NewReader(`{"phone": "1", "user": {"id": 2}, "n": 3}`))
	r.Header.Set("Content-Type", "application/json")
	b := ReadBody(r, DefaultBodyLimit, &fields)
	if v, _ := b.Field(BodyJSONPrefix + "phone"); v != "1" {
		t.Fatalf("phone %q", v)
	}
	first := &b.json[0]
	for name, want := range map[string]string{BodyFieldPrefix + "user.id": "2", BodyJSONPrefix + "n": "3", BodyJSONPrefix + "phone": "1"} {
		if v, err := b.Field(name); v != want || err != nil {
			t.Fatalf("%s: %q, %v", name, v, err)
		}
	}
	if &b.json[0] != first {
		t.Fatal("the body was parsed again")
	}
	// A field nobody declared is still found.
	if v, err := b.Field(BodyJSONPrefix + "user.id"); v != "2" || err != nil {
		t.Fatalf("undeclared field: %q, %v", v, err)
	}
}

// Several fields of one body through the handler's path: one parse.
func BenchmarkBodyFields(b *testing.B) {
	data := badBody()
	var fields BodyFields
	names := []string{BodyJSONPrefix + "phone", BodyJSONPrefix + "a.0", BodyJSONPrefix + "n", BodyFieldPrefix + "phone", BodyJSONPrefix + "x.y"}
	for _, n := range names {
		tmpl, _ := ParseTemplate("{" + n + "}")
		fields.Add(tmpl)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r, _ := http.NewRequest("POST", "/", bytes.NewReader(data))
		r.Header.Set("Content-Type", "application/json")
		body := ReadBody(r, DefaultBodyLimit, &fields)
		for _, n := range names {
			_, _ = body.Field(n)
		}
	}
}

// opaqueReader hides a reader's length, so that a request made with it has
// no Content-Length: as a chunked or HTTP/2 body arrives at a server.
type opaqueReader struct{ io.Reader }

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// The body's size is its declared Content-Length, else the bytes read of
// it, which must be all of it: a body larger than the limit, one whose
// reading failed or one with a Content-Encoding has no size, never the
// limit's or what happened to be read.
func TestBodySize(t *testing.T) {
	tests := []struct {
		name     string
		body     io.Reader
		declared int64 // -1: none (chunked, HTTP/2 without content-length)
		header   []string
		want     string
		err      error
	}{
		{"declared", strings.NewReader(`{"max_tokens": 10}`), 18, nil, "18", nil},
		{"declared, over the limit", strings.NewReader(strings.Repeat("x", 5000)), 5000, nil, "5000", nil},
		{"chunked", opaqueReader{strings.NewReader(strings.Repeat("x", 1000))}, -1, nil, "1000", nil},
		{"chunked, at the limit", opaqueReader{strings.NewReader(strings.Repeat("x", 1024))}, -1, nil, "1024", nil},
		{"chunked, over the limit", opaqueReader{strings.NewReader(strings.Repeat("x", 1025))}, -1, nil, "", ErrUnreadable},
		{"chunked, empty", opaqueReader{strings.NewReader("")}, -1, nil, "0", nil},
		{"chunked, cut short", io.MultiReader(strings.NewReader("abc"), failingReader{}), -1, nil, "", ErrUnreadable},
		{"no body", nil, 0, nil, "0", nil},
		{"gzip", strings.NewReader("\x1f\x8b\x08"), 3, []string{"Content-Encoding", "gzip"}, "", ErrUnreadable},
		{"chunked gzip", opaqueReader{strings.NewReader("\x1f\x8b\x08")}, -1, []string{"Content-Encoding", "gzip"}, "", ErrUnreadable},
		{"identity", strings.NewReader("abc"), 3, []string{"Content-Encoding", "identity"}, "3", nil},
		{"not JSON", strings.NewReader("abc"), 3, []string{"Content-Type", "text/plain"}, "3", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest("POST", "/", tt.body)
			r.ContentLength = tt.declared
			for i := 0; i+1 < len(tt.header); i += 2 {
				r.Header.Add(tt.header[i], tt.header[i+1])
			}
			b := ReadBody(r, 1024, nil)
			got, err := b.Size()
			if got != tt.want || (tt.err == nil) != (err == nil) || tt.err != nil && !errors.Is(err, tt.err) {
				t.Fatalf("size %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
			if v, err2 := lookup(r, nil, b, BodySize); v != got || (err2 == nil) != (err == nil) {
				t.Fatalf("the placeholder: %q, %v; Size: %q, %v", v, err2, got, err)
			}
		})
	}
}

// A body read for its size reaches the next handler whole, also when it
// is larger than the limit.
func TestBodySizePassesThrough(t *testing.T) {
	for _, n := range []int{0, 10, 1024, 1025, 3 * DefaultBodyLimit} {
		want := strings.Repeat("y", n)
		r, _ := http.NewRequest("POST", "/", opaqueReader{strings.NewReader(want)})
		r.ContentLength = -1
		tmpl, err := ParseTemplate("{" + BodySize + "}")
		if err != nil || !tmpl.NeedsBody() {
			t.Fatalf("template: %v, needs the body %v", err, tmpl.NeedsBody())
		}
		_, _ = tmpl.Expand(r, nil, ReadBody(r, 1024, nil))
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != want {
			t.Fatalf("a body of %d bytes came out as %d bytes (%v)", n, len(got), err)
		}
	}
}
