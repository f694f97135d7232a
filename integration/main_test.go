package integration

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Environment variables that pick which of the package's tests a test
// process runs, so that `make test` spreads them over several processes
// at once (each with its own in-process Caddy on its own ports, which a
// process has only one of) and runs on Valkey only the tests that start a
// server. Unset, every test runs.
const (
	// shardEnv is "i/n": run the i-th (from 1) of n disjoint parts of the
	// tests. Together the n parts are all of them.
	shardEnv = "SLUICE_TEST_SHARD"
	// redisOnlyEnv=1 runs only the tests that start a Redis server (or
	// may: see redisTests).
	redisOnlyEnv = "SLUICE_TEST_REDIS_ONLY"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if err := pickTests(); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// pickTests sets -test.skip to the tests that shardEnv and redisOnlyEnv
// leave out. -run still narrows what is left.
func pickTests() error {
	shard, shards, err := parseShard(os.Getenv(shardEnv))
	if err != nil {
		return err
	}
	redisOnly := os.Getenv(redisOnlyEnv) == "1"
	if shards == 1 && !redisOnly {
		return nil
	}
	if f := flag.Lookup("test.skip"); f == nil || f.Value.String() != "" {
		return fmt.Errorf("%s and %s cannot be combined with -skip", shardEnv, redisOnlyEnv)
	}
	all, redis, err := packageTests(".")
	if err != nil {
		return err
	}
	run := part(all, redis, shard, shards, redisOnly)
	var skip []string
	for _, name := range all {
		if !slices.Contains(run, name) {
			skip = append(skip, name)
		}
	}
	if len(skip) == 0 {
		return nil
	}
	for i := range skip {
		skip[i] = regexp.QuoteMeta(skip[i])
	}
	return flag.Set("test.skip", "^("+strings.Join(skip, "|")+")$")
}

// part is the tests of part shard (from 1) of shards, among all or, when
// redisOnly, among redis. The tests are dealt in turn, sorted by name, so
// that neighbours (often a feature's tests, alike in length) land in
// different parts.
func part(all, redis []string, shard, shards int, redisOnly bool) []string {
	from := all
	if redisOnly {
		from = redis
	}
	var run []string
	for i, name := range from {
		if i%shards == shard-1 {
			run = append(run, name)
		}
	}
	return run
}

// parseShard reads "i/n"; "" is the one part that is everything.
func parseShard(s string) (shard, shards int, err error) {
	if s == "" {
		return 1, 1, nil
	}
	a, b, ok := strings.Cut(s, "/")
	shard, err1 := strconv.Atoi(a)
	shards, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || shards < 1 || shard < 1 || shard > shards {
		return 0, 0, fmt.Errorf("%s=%q: want i/n with 1 <= i <= n", shardEnv, s)
	}
	return shard, shards, nil
}

// redisStarters are the redistest functions that start a server or check
// that one can be started (a test that runs the server's command itself
// calls Need first).
var redisStarters = []string{"Need", "Available", "Standalone", "Cluster", "Sentinel", "StartServer", "StartCluster", "StartSentinel"}

// packageTests reads the package's test files in dir and returns the names
// of its top-level tests, sorted, and of those that may use a Redis server:
// the tests that reach a redisStarter through the package's functions,
// methods and variables, and those named for Redis or a Cluster (which
// the Valkey leg ran by name before). A package-level name is followed
// wherever it appears, a method by its name alone whatever its receiver,
// so the second list may hold more tests than start a server, never fewer.
func packageTests(dir string) (all, redis []string, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, nil, err
	}
	fset := token.NewFileSet()
	topLevel := map[any]bool{}           // the package-level declarations of the file being read
	uses := map[string]map[string]bool{} // a package-level name: the names its body or value mentions
	reaches := map[string]bool{}         // the names whose body calls a redisStarter
	mention := func(from string, node ast.Node) {
		if uses[from] == nil {
			uses[from] = map[string]bool{}
		}
		ast.Inspect(node, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "redistest" {
					if slices.Contains(redisStarters, n.Sel.Name) {
						reaches[from] = true
					}
					return false
				}
				uses[from][n.Sel.Name] = true
			case *ast.Ident:
				if n.Obj == nil || topLevel[n.Obj.Decl] { // not one of the body's own names
					uses[from][n.Name] = true
				}
			}
			return true
		})
	}
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			return nil, nil, err
		}
		clear(topLevel)
		for _, decl := range f.Decls {
			topLevel[decl] = true
			if d, ok := decl.(*ast.GenDecl); ok {
				for _, spec := range d.Specs {
					topLevel[spec] = true
				}
			}
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Body == nil {
					continue
				}
				mention(d.Name.Name, d.Body)
				if d.Recv == nil && isTest(d) {
					all = append(all, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					if v, ok := spec.(*ast.ValueSpec); ok {
						for _, name := range v.Names {
							mention(name.Name, v)
						}
					}
				}
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for from, names := range uses {
			if reaches[from] {
				continue
			}
			for name := range names {
				if reaches[name] && name != from {
					reaches[from] = true
					changed = true
					break
				}
			}
		}
	}
	slices.Sort(all)
	for _, name := range all {
		if reaches[name] || strings.Contains(name, "Redis") || strings.Contains(name, "Cluster") {
			redis = append(redis, name)
		}
	}
	return all, redis, nil
}

// isTest is whether d is a test function that go test runs: TestXxx(t
// *testing.T), not TestMain.
func isTest(d *ast.FuncDecl) bool {
	name := d.Name.Name
	if !strings.HasPrefix(name, "Test") || name == "TestMain" || d.Type.Params == nil || len(d.Type.Params.List) != 1 {
		return false
	}
	if rest := name[len("Test"):]; rest != "" && strings.ToLower(rest[:1]) == rest[:1] && rest[:1] != "_" {
		return false
	}
	star, ok := d.Type.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// The parts of SLUICE_TEST_SHARD are disjoint and make up all the tests
// (or all the Redis tests), and the analysis finds the Redis server of a
// test that starts it through helpers, whatever its name.
func TestShardsPartTheTests(t *testing.T) {
	all, redis, err := packageTests(".")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(all, "TestShardsPartTheTests") || slices.Contains(all, "TestMain") {
		t.Fatalf("tests found: %v", all)
	}
	for _, name := range []string{"TestAdaptiveBucketRates", "TestOutcomeCooldown", "TestRedisFleetStandalone"} {
		if !slices.Contains(redis, name) {
			t.Errorf("%s starts a Redis server, but is not among %v", name, redis)
		}
	}
	if slices.Contains(redis, "TestShardsPartTheTests") {
		t.Errorf("TestShardsPartTheTests is among the Redis tests")
	}
	for _, redisOnly := range []bool{false, true} {
		want := all
		if redisOnly {
			want = redis
		}
		var got []string
		for shard := 1; shard <= 3; shard++ {
			got = append(got, part(all, redis, shard, 3, redisOnly)...)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("redisOnly=%v: the 3 parts hold %v, want %v", redisOnly, got, want)
		}
	}
}
