// Command conditions counts the branch points a request evaluates: every
// if condition, switch case and loop test that runs, from two coverage
// profiles of the same benchmark run for different numbers of requests
// (the set-up, counted in both, cancels out). bench/conditions.sh makes the
// profiles; this reads them with the module's sources:
//
//	conditions [-list] <profile of n1 requests> <n1> <profile of n2 requests> <n2>
//
// It prints the branch points per request, in total and per package, and
// with -list each one with its source line, so that a reader can tell the
// tests a request cannot avoid from those that ask whether a feature is on.
// A condition joined by && or || counts once: coverage does not see which
// operands ran.
package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// block is one counted block of a coverage profile.
type block struct {
	startLine, startCol, endLine, endCol int
	count                                int64
}

func (b block) contains(p token.Position) bool {
	after := p.Line > b.startLine || p.Line == b.startLine && p.Column >= b.startCol
	before := p.Line < b.endLine || p.Line == b.endLine && p.Column < b.endCol
	return after && before
}

// profile maps a file (as the profile names it: import path/file.go) to
// its blocks.
type profile map[string][]block

func readProfile(path string) (profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p := profile{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") || line == "" {
			continue
		}
		// name.go:l1.c1,l2.c2 statements count
		colon := strings.LastIndex(line, ":")
		fields := strings.Fields(line[colon+1:])
		if colon < 0 || len(fields) != 3 {
			return nil, fmt.Errorf("%s: cannot read %q", path, line)
		}
		var b block
		if _, err := fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.startLine, &b.startCol, &b.endLine, &b.endCol); err != nil {
			return nil, fmt.Errorf("%s: %q: %v", path, line, err)
		}
		if b.count, err = strconv.ParseInt(fields[2], 10, 64); err != nil {
			return nil, fmt.Errorf("%s: %q: %v", path, line, err)
		}
		name := line[:colon]
		// A block listed twice (a package built into two test binaries)
		// adds up.
		bs := p[name]
		if i := slices.IndexFunc(bs, func(o block) bool { return o.startLine == b.startLine && o.startCol == b.startCol }); i >= 0 {
			bs[i].count += b.count
			continue
		}
		p[name] = append(bs, b)
	}
	return p, sc.Err()
}

// point is a branch point that ran: how many times per request.
type point struct {
	file string
	line int
	text string
	per  float64
}

func main() {
	list := flag.Bool("list", false, "list every branch point a request runs")
	module := flag.String("module", "github.com/sluicehq/sluice", "the module path that profile names start with")
	root := flag.String("root", ".", "the module's directory")
	flag.Parse()
	if flag.NArg() != 4 {
		fmt.Fprintln(os.Stderr, "usage: conditions [-list] <profile> <requests> <profile> <requests>")
		os.Exit(2)
	}
	a, err := readProfile(flag.Arg(0))
	check(err)
	n1, err := strconv.Atoi(flag.Arg(1))
	check(err)
	b, err := readProfile(flag.Arg(2))
	check(err)
	n2, err := strconv.Atoi(flag.Arg(3))
	check(err)
	if n2 <= n1 {
		check(fmt.Errorf("the second profile must cover more requests than the first"))
	}
	per := perRequest(a, b)
	n := float64(n2 - n1)

	var points []point
	for name, blocks := range per {
		local := filepath.Join(*root, strings.TrimPrefix(strings.TrimPrefix(name, *module), "/"))
		ps, err := branchPoints(local, name, blocks, n)
		check(err)
		points = append(points, ps...)
	}
	slices.SortFunc(points, func(x, y point) int {
		return cmp.Or(cmp.Compare(x.file, y.file), cmp.Compare(x.line, y.line))
	})
	total := 0.0
	byPkg := map[string]float64{}
	for _, p := range points {
		total += p.per
		byPkg[filepath.Dir(p.file)] += p.per
	}
	fmt.Printf("branch points per request: %.1f\n", total)
	for _, pkg := range slices.Sorted(maps.Keys(byPkg)) {
		fmt.Printf("  %-50s %.1f\n", pkg, byPkg[pkg])
	}
	if *list {
		for _, p := range points {
			fmt.Printf("%5.1f  %s:%d  %s\n", p.per, strings.TrimPrefix(p.file, *module+"/"), p.line, p.text)
		}
	}
}

// perRequest is each block's count over the requests that b has more than
// a: the difference of the two profiles' counts.
func perRequest(a, b profile) map[string][]block {
	out := map[string][]block{}
	for name, bs := range b {
		for _, blk := range bs {
			if i := slices.IndexFunc(a[name], func(o block) bool { return o.startLine == blk.startLine && o.startCol == blk.startCol }); i >= 0 {
				blk.count -= a[name][i].count
			}
			out[name] = append(out[name], blk)
		}
	}
	return out
}

// branchPoints finds the branch points of file that ran and how often per
// request.
func branchPoints(path, name string, blocks []block, requests float64) ([]point, error) {
	fset := token.NewFileSet()
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(src), "\n")
	countAt := func(pos token.Pos) int64 {
		p := fset.Position(pos)
		for _, b := range blocks {
			if b.contains(p) {
				return b.count
			}
		}
		return 0
	}
	var points []point
	add := func(pos token.Pos, n int64) {
		if n <= 0 {
			return
		}
		line := fset.Position(pos).Line
		points = append(points, point{file: name, line: line, text: strings.TrimSpace(lines[line-1]), per: float64(n) / requests})
	}
	// The count of a body: its first statement's block (an empty body
	// never runs anything that the profile counts).
	bodyCount := func(stmts []ast.Stmt) int64 {
		if len(stmts) == 0 {
			return 0
		}
		return countAt(stmts[0].Pos())
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.IfStmt:
			add(s.Cond.Pos(), countAt(s.Cond.Pos()))
		case *ast.ForStmt:
			if s.Cond != nil {
				// Tested once per iteration and once more to leave.
				add(s.Cond.Pos(), countAt(s.Pos())+bodyCount(s.Body.List))
			}
		case *ast.RangeStmt:
			add(s.X.Pos(), countAt(s.Pos())+bodyCount(s.Body.List))
		case *ast.SwitchStmt:
			addClauses(s.Pos(), s.Body, countAt, bodyCount, add)
		case *ast.TypeSwitchStmt:
			addClauses(s.Pos(), s.Body, countAt, bodyCount, add)
		}
		return true
	})
	return points, nil
}

// addClauses counts a switch's case clauses: a clause is tested when the
// switch runs and no clause before it was taken.
func addClauses(pos token.Pos, body *ast.BlockStmt, countAt func(token.Pos) int64, bodyCount func([]ast.Stmt) int64, add func(token.Pos, int64)) {
	left := countAt(pos)
	for _, st := range body.List {
		c := st.(*ast.CaseClause)
		if c.List == nil { // default: no test
			continue
		}
		add(c.Pos(), left)
		left -= bodyCount(c.Body)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "conditions:", err)
		os.Exit(1)
	}
}
