package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestProtocolLuaIsCurrent fails when lua/00-protocol.lua is not what
// protocol.go generates: the script would read other names, or other
// values, than the Go side sends.
func TestProtocolLuaIsCurrent(t *testing.T) {
	src, err := os.ReadFile("../../protocol.go")
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../lua/00-protocol.lua")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("backend/redis/lua/00-protocol.lua is stale: run go generate ./backend/redis/")
	}
}

func TestGenerate(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string // lines the output holds
		err       string
	}{
		{"string", "const modeDecide = \"d\"", []string{`local MODE_DECIDE = "d"`}, ""},
		{"rune as a string", "const kindBucket = 'b'", []string{`local KIND_BUCKET = "b"`}, ""},
		{"integer", "const keyArgP1 = 2", []string{`local KEY_ARG_P1 = 2`}, ""},
		{"arithmetic over constants", "const (\n\ta = 2\n\tb = a*3 + 1\n)", []string{`local B = 7`}, ""},
		{"escapes", "const s = \"a\\\"b\\\\c\\n\"", []string{`local S = "a\"b\\c\010"`}, ""},
		{"doc comment, names renamed", "// x is one more than keyArgs.\nconst x = 1", []string{"-- X is one more than keyArgs."}, ""},
		{"group and line comments", "// The group.\nconst (\n\t// a is A.\n\ta = 1 // one\n)", []string{"-- The group.", "-- A is A.", "local A = 1 -- one"}, ""},
		{"iota", "const (\n\ta = iota\n\tb\n)", nil, "iota"},
		{"unknown name", "const a = b + 1", nil, "not a constant declared above"},
		{"division", "const a = 4 / 2", nil, "only +, - and *"},
		{"inexact in Lua", "const a = 1 << 60", nil, "operator <<"},
		{"too large", "const a = 9007199254740993", nil, "not exact in Lua's numbers"},
		{"float", "const a = 1.5", nil, "no Lua form"},
		{"no constants", "var a = 1", nil, "no constants"},
		{"names that meet in Lua", "const (\n\tkeyArg = 1\n\tkey_arg = 2\n)", nil, "both KEY_ARG"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := generate([]byte("package p\n\n" + c.src + "\n"))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), "\n"+w+"\n") {
					t.Errorf("output lacks the line %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestUpperSnake(t *testing.T) {
	for in, want := range map[string]string{
		"modeDecide":         "MODE_DECIDE",
		"keyArgP1":           "KEY_ARG_P1",
		"keyArgs":            "KEY_ARGS",
		"replyNowSeconds":    "REPLY_NOW_SECONDS",
		"decideShadow":       "DECIDE_SHADOW",
		"keyArgX2":           "KEY_ARG_X2",
		"maxTTLSeconds":      "MAX_TTL_SECONDS",
		"reservationsSuffix": "RESERVATIONS_SUFFIX",
	} {
		if got := upperSnake(in); got != want {
			t.Errorf("upperSnake(%q) = %q, want %q", in, got, want)
		}
	}
}
