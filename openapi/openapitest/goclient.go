package openapitest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// configTemplate is oapi-codegen's configuration of a package, named by its %s. A
// member that may be null is a nullable.Nullable (nullable-type), which tells a member
// left out from one sent as null: a key's PATCH sends {"scopes":null} to give the key
// everything its role allows, and leaves scopes out to keep them. docs/openapi.md
// gives a client developer the same configuration.
const configTemplate = `package: %s
generate:
  models: true
  client: true
output-options:
  nullable-type: true
import-mapping:
  v1.yaml: goclient/v1
`

// GoClient returns a new temporary directory holding the Go module of
// openapi/testdata/goclient (a program a client developer writes, and its test) and
// the clients that oapi-codegen, the version go.mod pins as a tool, generates from the
// documents with configTemplate: package goclient/v1 from v1.yaml and
// goclient/dashboard from dashboard.yaml, whose references to v1.yaml become imports of
// goclient/v1 (import-mapping). It fails t if oapi-codegen refuses a document.
func GoClient(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("openapitest: cannot find its own source")
	}
	docs := filepath.Dir(filepath.Dir(self)) // openapi/, which holds the documents
	dir := t.TempDir()
	for _, name := range []string{"go.mod", "go.sum", "main.go", "main_test.go"} {
		b, err := os.ReadFile(filepath.Join(docs, "testdata", "goclient", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, gen := range []struct{ pkg, doc string }{
		{"v1", "v1.yaml"},
		{"dashboard", "dashboard.yaml"},
	} {
		if err := os.Mkdir(filepath.Join(dir, gen.pkg), 0o755); err != nil {
			t.Fatal(err)
		}
		config := filepath.Join(dir, gen.pkg, "oapi-codegen.yaml")
		if err := os.WriteFile(config, []byte(fmt.Sprintf(configTemplate, gen.pkg)), 0o644); err != nil {
			t.Fatal(err)
		}
		// Run in docs, inside this module, so that go tool finds the pinned version.
		cmd := exec.Command("go", "tool", "oapi-codegen", "-config", config,
			"-o", filepath.Join(dir, gen.pkg, gen.pkg+".gen.go"), gen.doc)
		cmd.Dir = docs
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("oapi-codegen %s: %v\n%s", gen.doc, err, out)
		}
	}
	return dir
}

// Go runs the go command with args in dir, a module GoClient made, and fails t with
// its output if it fails.
func Go(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v in the generated client's module: %v\n%s", args, err, out)
	}
}
