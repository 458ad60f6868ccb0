package caddymodule

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/keygate/keygate/caddymodule/jwks"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

// TestDocsConfigurationNamesEveryOption fails when docs/configuration.md misses an
// option. It must mention, as code (`name`), every subdirective the v1_gateway
// Caddyfile parser accepts, and every JSON field of Handler and JWKS. An option added
// to the code must be documented with it.
func TestDocsConfigurationNamesEveryOption(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	options := caddyfileOptions(t, "caddyfile.go", "UnmarshalCaddyfile")
	if len(options) < 20 {
		t.Fatalf("found only %d options in caddyfile.go's switch (%v): has the parser moved?", len(options), options)
	}
	names := slices.Concat(options, jsonFields(Handler{}), jsonFields(jwks.JWKS{}))
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
// the method fn of file. They are the subdirectives the parser accepts.
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

// TestTheREADMEsMinimalCaddyfileIsCleanAndKeepsKeysOutOfTheLog takes the Caddyfile of
// the README as a platform team would. It must be `caddy fmt`-clean, and adapt
// without a warning. Run with its own key file, database and upstream, it must keep a
// key out of its log. The key is sent where keys do not belong: ?api_key=, X-Api-Key.
func TestTheREADMEsMinimalCaddyfileIsCleanAndKeepsKeysOutOfTheLog(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(readme, []byte("## A minimal Caddyfile"))
	m := regexp.MustCompile("(?s)\n```\n(.*?)```").FindSubmatch(readme[max(i, 0):])
	if i < 0 || m == nil {
		t.Fatal("no code block under \"## A minimal Caddyfile\" in README.md")
	}
	text := m[1]
	if formatted := caddyfile.Format(text); !bytes.Equal(formatted, text) {
		t.Errorf("the README's Caddyfile is not caddy fmt-clean; caddy fmt makes it:\n%s", formatted)
	}
	if _, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(text, nil); err != nil || len(warnings) > 0 {
		t.Errorf("adapting the README's Caddyfile: %v, warnings %v", err, warnings)
	}

	// Run it: the README's paths and ports are this test's.
	d, key, _ := newDBWithKey(t)
	_, keyFile := gatewayauthtest.NewKey(t)
	up := newUpstream(t)
	listen := freeAddr(t)
	t.Setenv("DATABASE_URL", d.url)
	t.Setenv("REDIS_URL", redisURL(t))
	run := strings.NewReplacer("/etc/keygate/identity.pem", keyFile, ":8080", listen[strings.LastIndexByte(listen, ':'):],
		"127.0.0.1:9000", up.addr()).Replace(string(text))
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(run), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its log, which goes to stderr, goes to a file here.
	var cfg map[string]any
	json.Unmarshal(out, &cfg)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	logging, _ := cfg["logging"].(map[string]any)
	logs, _ := logging["logs"].(map[string]any)
	def, _ := logs["default"].(map[string]any)
	if def == nil {
		def = map[string]any{}
	}
	def["writer"] = map[string]any{"output": "file", "filename": logPath}
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": def}}
	out, _ = json.Marshal(cfg)
	if err := caddy.Load(out, true); err != nil {
		t.Fatalf("loading the README's Caddyfile: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })

	secret := key[strings.IndexByte(key, '.')+1:]
	for _, path := range []string{"/v1/monitors?api_key=" + key, "/dashboard?api_key=" + key, "/.well-known/jwks.json"} {
		req, _ := http.NewRequest("GET", "http://"+listen+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Api-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if path != "/dashboard?api_key="+key && res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, res.StatusCode)
		}
	}
	var logged string
	testenv.Eventually(t, 5*time.Second, "the access log lines of the 3 requests", func() bool {
		b, _ := os.ReadFile(logPath)
		logged = string(b)
		return strings.Count(logged, `"msg":"handled request"`) >= 3
	})
	if strings.Count(logged, `"msg":"handled request"`) != 3 || !strings.Contains(logged, `"uri":"/v1/monitors?api_key=`) {
		t.Fatalf("the access log has not the 3 requests:\n%s", logged)
	}
	if strings.Contains(logged, secret) {
		t.Errorf("the README's Caddyfile logs the key's secret:\n%s", logged)
	}
}
