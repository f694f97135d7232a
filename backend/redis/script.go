package redis

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"io/fs"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend/redis/internal/luasrc"
)

// The script is the files lua/NN-<part>.lua joined in name order: the
// protocol's names (00-protocol.lua, generated from protocol.go), the
// clock and the shared arithmetic, each algorithm, each feature, and last
// the call's dispatch on its mode, the function call. The parts make one
// script, not a module each: Redis runs one text, and a part sees the
// locals of the parts before it. The protocol's names are written as
// their values in the text Redis runs (luasrc says why), which
//
//	(cd backend/redis && go run ./internal/luagen -script)
//
// prints.
//
// The text is loaded into Redis once as a library of Functions
// (FUNCTION LOAD, Redis 7 and Valkey), whose one function, call, each
// decision runs by FCALL: the library's functions are made when it is
// loaded, where a script run by EVALSHA makes all of them again on every
// call, which cost more than a few decisions. A server without Functions
// (Redis 6), or a user the ACL does not let run FUNCTION or FCALL, runs
// the same text as a script, by EVALSHA (run).
//
//go:embed lua/*.lua
var luaFiles embed.FS

// scriptSource is the text every decision runs as a script (EVALSHA);
// protocol is what its names stand for, to write them in admin.lua too.
// functionSource is the same text as a library of Functions, and
// functionName names the library and its one function: the script's
// SHA1, so that the instances of a rolling upgrade each call their own.
var scriptSource, functionSource, functionName, protocol = joinScript()

// script is run by its SHA1 (EVALSHA) on a server without Functions; after
// NOSCRIPT (a restart, a failover, SCRIPT FLUSH) the full source is sent
// once (EVAL), which caches it again.
var script = goredis.NewScript(scriptSource)

// The heads of a script call, boxed once: FCALL and the function, or
// EVALSHA and the script's SHA1.
var (
	fcallArg   any = "fcall"
	functionID any = functionName
	evalshaArg any = "evalsha"
	scriptHash any = script.Hash()
)

func joinScript() (src, lib, name string, p luasrc.Protocol) {
	dir, err := fs.Sub(luaFiles, "lua")
	if err == nil {
		var text string
		if text, p, err = luasrc.Join(dir); err == nil {
			// The parts end with the function a call runs, call.
			src = text + "return call(_G.KEYS, _G.ARGV)\n"
			sum := sha1.Sum([]byte(src))
			name = "sluice_" + hex.EncodeToString(sum[:])
			// The library's first line names it; it takes the place of
			// the parts' first line, a comment, so that an error's line
			// (user_function:N) is line N of the parts joined, as a
			// script's (user_script:N) is.
			_, rest, _ := strings.Cut(text, "\n")
			lib = "#!lua name=" + name + "\n" + rest + "redis.register_function('" + name + "', call)\n"
			return src, lib, name, p
		}
	}
	panic("redis backend: the script's parts: " + err.Error())
}

// callHead is the first two arguments of a script call: FCALL and the
// function, or EVALSHA and the script's SHA1 once the server refused
// Functions.
func (s *Store) callHead() (verb, id any) {
	if s.noFunctions.Load() {
		return evalshaArg, scriptHash
	}
	return fcallArg, functionID
}

// again rewrites a script call that did not run, from the error that says
// why, so that it may be sent once more and still run at most once: FCALL
// of a function the server does not have (a restart, a failover to a
// server that never had it, FUNCTION FLUSH) once it is loaded, FCALL on a
// server without Functions or to a user the ACL refuses them as EVALSHA,
// EVALSHA of a script the server does not have as EVAL with the source.
// It reports false for a call that needs nothing, or may have run; err is
// the failure of loading the function, which the call's stands for.
func (s *Store) again(ctx context.Context, cmd *goredis.Cmd) (ok bool, err error) {
	e := cmd.Err()
	if e == nil {
		return false, nil
	}
	a := cmd.Args()
	if len(a) < 3 {
		return false, nil
	}
	verb, _ := a[0].(string)
	switch {
	case goredis.HasErrorPrefix(e, "NOSCRIPT"):
		a[0], a[1] = "eval", scriptSource
		return true, nil
	case verb == "fcall" && goredis.HasErrorPrefix(e, "Function not found"):
		refused, err := s.loadFunction(ctx, a)
		if err != nil {
			return false, err
		}
		if refused {
			a[0], a[1] = evalshaArg, scriptHash
		}
		return true, nil
	case verb == "fcall" && functionsRefused(e):
		s.noFunctions.Store(true)
		a[0], a[1] = evalshaArg, scriptHash
		return true, nil
	}
	return false, nil
}

// functionsRefused reports whether err says the server has no Functions
// (Redis 6, or FUNCTION renamed away) or the user may not use them: the
// command was not run.
func functionsRefused(err error) bool {
	return goredis.HasErrorPrefix(err, "unknown command") || goredis.HasErrorPrefix(err, "NOPERM")
}

// loadFunction loads the library into the server that answered the call
// args (on a cluster, the master of its first key: each master loads it
// when it first lacks it). refused is true when the server will not load
// it, and the store goes on with EVALSHA; err is a failure that may pass
// (the server busy, loading, a replica, or not answering).
func (s *Store) loadFunction(ctx context.Context, args []any) (refused bool, err error) {
	node := goredis.UniversalClient(s.client)
	if c, ok := s.client.(*goredis.ClusterClient); ok && len(args) > 3 {
		var key string
		switch k := args[3].(type) {
		case string:
			key = k
		case *string: // a batch call's (manyCmd)
			key = *k
		}
		if node, err = c.MasterForKey(ctx, key); err != nil {
			return false, err
		}
	}
	err = node.Do(ctx, "function", "load", "replace", functionSource).Err()
	var reply goredis.Error
	if err == nil || !errors.As(err, &reply) {
		return false, err
	}
	if code, _, _ := strings.Cut(reply.Error(), " "); serverCodes[code] && code != "NOPERM" {
		return false, err
	}
	s.noFunctions.Store(true)
	return true, nil
}
