package redis

import (
	"embed"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// The script is the files of lua/ whose names start with a digit, joined
// in name order: the protocol's names (generated from protocol.go), the
// clock and the shared arithmetic, each algorithm, each feature, and last
// the dispatch on the mode. `cat backend/redis/lua/[0-9]*.lua` prints the
// text Redis runs. The parts make one script, not a module each: Redis
// runs one text per call, and a part sees the locals of the parts before
// it.
//
//go:embed lua/[0-9]*.lua
var scriptParts embed.FS

// scriptSource is the script every decision runs.
var scriptSource = assemble(scriptParts, "lua")

// script is loaded into Redis on first use and run by its SHA1 (EVALSHA),
// the SHA1 of scriptSource; after NOSCRIPT (a restart, a failover, SCRIPT
// FLUSH) the full source is sent once (EVAL), which caches it again.
var script = goredis.NewScript(scriptSource)

// assemble joins the files of dir in fsys in name order.
func assemble(fsys embed.FS, dir string) string {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		panic("redis backend: the script's parts: " + err.Error())
	}
	var b strings.Builder
	for _, e := range entries {
		part, err := fsys.ReadFile(dir + "/" + e.Name())
		if err != nil {
			panic("redis backend: the script's parts: " + err.Error())
		}
		b.Write(part)
	}
	return b.String()
}
