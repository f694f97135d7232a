package luasrc

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

func TestInline(t *testing.T) {
	p := Protocol{"MODE_DECIDE": `"d"`, "KEY_ARGS": "11"}
	cases := []struct{ name, in, want string }{
		{"code", "if mode == MODE_DECIDE then o = o + KEY_ARGS end", `if mode == "d" then o = o + 11 end`},
		{"comment", "x = KEY_ARGS -- KEY_ARGS per key", "x = 11 -- KEY_ARGS per key"},
		{"long comment", "--[[ MODE_DECIDE\nKEY_ARGS ]] KEY_ARGS", "--[[ MODE_DECIDE\nKEY_ARGS ]] 11"},
		{"strings", `s = 'MODE_DECIDE' .. "KEY_ARGS\"KEY_ARGS" .. [==[KEY_ARGS]==]`, `s = 'MODE_DECIDE' .. "KEY_ARGS\"KEY_ARGS" .. [==[KEY_ARGS]==]`},
		{"field", "t.KEY_ARGS = KEY_ARGS", "t.KEY_ARGS = 11"},
		{"longer names", "KEY_ARGS_X = MODE_DECIDED", "KEY_ARGS_X = MODE_DECIDED"},
		{"numbers", "x = 1e9 + 0x1F", "x = 1e9 + 0x1F"},
		{"index", "ARGV[o + KEY_ARGS]", "ARGV[o + 11]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.Inline(c.in); got != c.want {
				t.Fatalf("Inline(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestJoin(t *testing.T) {
	fsys := fstest.MapFS{
		"00-protocol.lua": {Data: []byte("-- Code generated.\n\n-- The mode.\nlocal MODE_DECIDE = \"d\" -- decide\nlocal KEY_ARGS = 11\n")},
		"01-base.lua":     {Data: []byte("local mode = ARGV[1]\n")},
		"02-main.lua":     {Data: []byte("if mode == MODE_DECIDE then return KEY_ARGS end\n")},
		"admin.lua":       {Data: []byte("not a part\n")},
	}
	src, p, err := Join(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := "-- Code generated.\n\n-- The mode.\n-- local MODE_DECIDE = \"d\" -- decide\n-- local KEY_ARGS = 11\n" +
		"local mode = ARGV[1]\n" + "if mode == \"d\" then return 11 end\n"
	if src != want {
		t.Fatalf("joined:\n%s\nwant:\n%s", src, want)
	}
	if p["KEY_ARGS"] != "11" || p["MODE_DECIDE"] != `"d"` || len(p) != 2 {
		t.Fatalf("protocol %v", p)
	}

	delete(fsys, "00-protocol.lua")
	if _, _, err := Join(fsys); err == nil {
		t.Fatal("joined parts without the protocol")
	}
	fsys["00-protocol.lua"] = &fstest.MapFile{Data: []byte("local X = 1\nprint(X)\n")}
	if _, _, err := Join(fsys); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err %v, want one naming line 2", err)
	}
}

// TestScriptNames holds the store's parts to names that exist: every name
// in upper snake case (with an underscore, as the protocol's are) that the
// code uses is the protocol's or a local of the parts (Lua reads an unknown name as a global, and Redis refuses the
// script only when that line runs).
func TestScriptNames(t *testing.T) {
	fsys := os.DirFS("../../lua")
	src, p, err := Join(fsys)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{"KEYS": true, "ARGV": true}
	for _, m := range regexp.MustCompile(`(?m)^\s*local ([A-Z][A-Z0-9_]*)\b`).FindAllStringSubmatch(src, -1) {
		declared[m[1]] = true
	}
	admin, err := os.ReadFile("../../lua/admin.lua")
	if err != nil {
		t.Fatal(err)
	}
	upper := regexp.MustCompile(`^[A-Z][A-Z0-9]*_[A-Z0-9_]+$`)
	for _, text := range []string{src, p.Inline(string(admin))} {
		rewriteNames(text, func(w string) string {
			if upper.MatchString(w) && !declared[w] {
				t.Errorf("the script uses %s, which is neither the protocol's nor a local", w)
			}
			return w
		})
	}
	if len(p) < 40 {
		t.Errorf("the protocol names %d constants", len(p))
	}
}
