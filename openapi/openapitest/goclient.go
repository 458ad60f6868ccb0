package openapitest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// GoClient returns a new temporary directory holding the Go module of
// openapi/testdata/goclient (a program a client developer writes) and the clients that
// oapi-codegen, the version go.mod pins as a tool, generates from the documents:
// package goclient/v1 from v1.yaml and goclient/dashboard from dashboard.yaml, whose
// references to v1.yaml become imports of goclient/v1 (-import-mapping). It fails t if
// oapi-codegen refuses a document.
func GoClient(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("openapitest: cannot find its own source")
	}
	docs := filepath.Dir(filepath.Dir(self)) // openapi/, which holds the documents
	dir := t.TempDir()
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
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
		// Run in docs, inside this module, so that go tool finds the pinned version.
		cmd := exec.Command("go", "tool", "oapi-codegen", "-generate", "types,client", "-package", gen.pkg,
			"-import-mapping", "v1.yaml:goclient/v1", "-o", filepath.Join(dir, gen.pkg, gen.pkg+".gen.go"), gen.doc)
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
