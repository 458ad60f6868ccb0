package caddymodule

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDocsConfigurationNamesEveryOption fails when docs/configuration.md does not
// mention, as code (`name`), every subdirective the v1_gateway Caddyfile parser
// accepts or every JSON field of Handler and JWKS: an option added to the code must be
// documented with it.
func TestDocsConfigurationNamesEveryOption(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	options := caddyfileOptions(t, "caddyfile.go", "UnmarshalCaddyfile")
	if len(options) < 20 {
		t.Fatalf("found only %d options in caddyfile.go's switch (%v): has the parser moved?", len(options), options)
	}
	names := slices.Concat(options, jsonFields(Handler{}), jsonFields(JWKS{}))
	slices.Sort(names)
	names = slices.Compact(names)

	var missing []string
	for _, name := range names {
		if !strings.Contains(string(doc), "`"+name+"`") {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/configuration.md does not mention these options as `name`: %s", strings.Join(missing, ", "))
	}
}

// caddyfileOptions returns the string literals of the case clauses of the switch in
// the method fn of file: the subdirectives the parser accepts.
func caddyfileOptions(t *testing.T, file, fn string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var options []string
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn || fd.Recv == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			sw, ok := n.(*ast.SwitchStmt)
			if !ok {
				return true
			}
			for _, stmt := range sw.Body.List {
				for _, expr := range stmt.(*ast.CaseClause).List {
					if lit, ok := expr.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						name, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						options = append(options, name)
					}
				}
			}
			return true
		})
	}
	if options == nil {
		t.Fatalf("no option switch found in %s's %s", file, fn)
	}
	return options
}

// jsonFields returns the JSON names of v's exported fields.
func jsonFields(v any) []string {
	var names []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		tag, ok := typ.Field(i).Tag.Lookup("json")
		if name, _, _ := strings.Cut(tag, ","); ok && name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}
