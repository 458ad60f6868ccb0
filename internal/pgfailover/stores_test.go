package pgfailover_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEveryWriteOfTheStoresSaysHowItCommits reads the store packages' code: no
// statement that writes goes to a pool but through this package, which makes it say
// whether it commits Local or Synced. A pool's Exec, Begin, BeginTx and CopyFrom are
// writes; a Query or QueryRow is one when its SQL inserts, updates or deletes. A
// transaction's own statements inherit its Commit from Begin.
func TestEveryWriteOfTheStoresSaysHowItCommits(t *testing.T) {
	writes := regexp.MustCompile(`\b(INSERT|DELETE)\b|(^|[^Y] )UPDATE\b`) // not FOR [NO KEY] UPDATE
	checked := 0
	for _, dir := range []string{"../../keystore", "../../upstream/store"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !isPool(sel.X) {
					return true
				}
				switch sel.Sel.Name {
				case "Exec", "Begin", "BeginTx", "CopyFrom":
					t.Errorf("%s: a pool's %s: write through pgfailover, Local or Synced", fset.Position(call.Pos()), sel.Sel.Name)
				case "Query", "QueryRow":
					if len(call.Args) > 1 && writes.MatchString(literal(call.Args[1])) {
						t.Errorf("%s: a pool's %s writes: write through pgfailover, Local or Synced", fset.Position(call.Pos()), sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d files; the store packages moved?", checked)
	}
}

// isPool reports whether x names a pool: pool, or any x.pool.
func isPool(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name == "pool"
	case *ast.SelectorExpr:
		return x.Sel.Name == "pool"
	}
	return false
}

// literal returns the text of the string literals e is made of; an SQL built from
// constants elsewhere reads as empty.
func literal(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		s, _ := strconv.Unquote(e.Value)
		return s
	case *ast.BinaryExpr:
		return literal(e.X) + literal(e.Y)
	}
	return ""
}
