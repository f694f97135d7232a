package keys

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

func TestJSONField(t *testing.T) {
	doc := `{"phone": "01712345678", "n": 8801712345678, "ok": true, "user": {"email": "a@b.co", "tags": ["x", {"id": 7}]}, "nil": null, "obj": {}}`
	tests := []struct {
		path, want string
		ok         bool
	}{
		{"phone", "01712345678", true},
		{"n", "8801712345678", true},
		{"ok", "true", true},
		{"user.email", "a@b.co", true},
		{"user.tags.0", "x", true},
		{"user.tags.1.id", "7", true},
		{"user.tags.2", "", false},
		{"user.missing", "", false},
		{"nil", "", false},
		{"obj", "", false},
		{"user", "", false},
		{"phone.x", "", false},
	}
	for _, tt := range tests {
		got, err := JSONField([]byte(doc), tt.path)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("%s → %q, %v; want %q ok=%v", tt.path, got, err, tt.want, tt.ok)
		}
	}
	for _, bad := range []string{
		``, `{`, `{"phone": "1"`, `{"phone": "1"} trailing`, `not json`,
		`{"phone": "1", "phone": "2"}`, // duplicates: the app may read the other one
		`[` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 101),
		`{"phone": "1", "x": [1, 2,]}`, // invalid after the field
	} {
		if got, err := JSONField([]byte(bad), "phone"); err == nil {
			t.Errorf("%.60q gave %q", bad, got)
		}
	}
	// Another case of the key is the key (Go's encoding/json reads it so),
	// and two spellings of it are ambiguous.
	if got, err := JSONField([]byte(`{"PHONE": "5"}`), "phone"); err != nil || got != "5" {
		t.Errorf("only spelling in another case: %q, %v", got, err)
	}
	for _, bad := range []string{`{"phone": "1", "PHONE": "2"}`, `{"Phone": "1", "phone": "2"}`, `{"user": {"ID": 1, "id": 2}}`} {
		path := "phone"
		if strings.Contains(bad, "user") {
			path = "user.id"
		}
		if _, err := JSONField([]byte(bad), path); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: error %v, want ErrAmbiguous", bad, err)
		}
	}
	// A repeated key off the path is the application's business.
	if got, err := JSONField([]byte(`{"x": 1, "x": 2, "phone": "5"}`), "phone"); err != nil || got != "5" {
		t.Errorf("repeated key off the path: %q, %v", got, err)
	}
}

// The body is read once, bounded, and handed on byte for byte, whether it
// was fully read, larger than the limit, or not parsed at all.
func TestReadBodyPassesThrough(t *testing.T) {
	big := make([]byte, 3*DefaultBodyLimit)
	_, _ = rand.Read(big)
	for _, body := range [][]byte{nil, []byte(`{"phone":"01712345678"}`), []byte("email=a%40b.co&x=1"), big} {
		r, _ := http.NewRequest("POST", "/", bytes.NewReader(body))
		b := ReadBody(r, DefaultBodyLimit)
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body of %d bytes came out as %d bytes (%v)", len(body), len(got), err)
		}
		if err := r.Body.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = b.Field(BodyJSONPrefix + "phone")
		if len(body) > DefaultBodyLimit && err == nil {
			t.Fatal("a body over the limit was parsed")
		}
	}
	r, _ := http.NewRequest("POST", "/", strings.NewReader("email=A%40b.co&x=1&x=2"))
	b := ReadBody(r, DefaultBodyLimit)
	if v, err := b.Field(BodyFormPrefix + "email"); err != nil || v != "A@b.co" {
		t.Fatalf("form field: %q, %v", v, err)
	}
	if _, err := b.Field(BodyFormPrefix + "x"); err == nil {
		t.Fatal("a repeated form field was accepted")
	}
	if _, err := b.Field(BodyFormPrefix + "nope"); err == nil {
		t.Fatal("a missing form field was found")
	}

	// multipart/form-data, as browsers send a form with a file input.
	var mp bytes.Buffer
	w := multipart.NewWriter(&mp)
	_ = w.WriteField("username", "Rakib")
	fw, _ := w.CreateFormFile("avatar", "a.png")
	_, _ = fw.Write([]byte("username=ignored"))
	_ = w.Close()
	r, _ = http.NewRequest("POST", "/", bytes.NewReader(mp.Bytes()))
	r.Header.Set("Content-Type", w.FormDataContentType())
	b = ReadBody(r, DefaultBodyLimit)
	if v, err := b.Field(BodyFormPrefix + "username"); err != nil || v != "Rakib" {
		t.Fatalf("multipart field: %q, %v", v, err)
	}
	if _, err := b.Field(BodyFormPrefix + "avatar"); err == nil {
		t.Fatal("a file part was read as a field")
	}
	if got, _ := io.ReadAll(r.Body); !bytes.Equal(got, mp.Bytes()) {
		t.Fatal("multipart body changed on its way through")
	}
}

func FuzzJSONField(f *testing.F) {
	f.Add([]byte(`{"phone": "01712345678", "user": {"id": [1, 2]}}`), "user.id.1")
	f.Add([]byte(`{"a":{"a":{"a":"x"}}}`), "a.a.a")
	f.Add([]byte(`[1,{"b":true}]`), "1.b")
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		v, err := JSONField(data, path)
		if err == nil && len(v) > len(data) {
			t.Fatalf("value %q longer than the document", v)
		}
	})
}
