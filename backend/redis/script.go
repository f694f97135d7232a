package redis

import (
	"embed"
	"io/fs"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/redis/internal/luasrc"
)

// The script is the files lua/NN-<part>.lua joined in name order: the
// protocol's names (00-protocol.lua, generated from protocol.go), the
// clock and the shared arithmetic, each algorithm, each feature, and last
// the call's dispatch on its mode. The parts make one script, not a module
// each: Redis runs one text per call, and a part sees the locals of the
// parts before it. The protocol's names are written as their values in
// the text Redis runs (luasrc says why), which
//
//	(cd backend/redis && go run ./internal/luagen -script)
//
// prints.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// scriptSource is the script every decision runs; protocol is what its
// names stand for, to write them in admin.lua too.
var scriptSource, protocol = joinScript()

// script is loaded into Redis on first use and run by its SHA1 (EVALSHA),
// the SHA1 of scriptSource; after NOSCRIPT (a restart, a failover, SCRIPT
// FLUSH) the full source is sent once (EVAL), which caches it again.
var script = goredis.NewScript(scriptSource)

func joinScript() (string, luasrc.Protocol) {
	dir, err := fs.Sub(luaFiles, "lua")
	if err == nil {
		var src string
		var p luasrc.Protocol
		if src, p, err = luasrc.Join(dir); err == nil {
			return src, p
		}
	}
	panic("redis backend: the script's parts: " + err.Error())
}
