package openapi_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/keygate/keygate/openapi/openapitest"
)

// untypedField is a struct field of a generated type that is interface{}: a member the
// document leaves untyped (an enum without type, say), which a client must assert
// before using. Free-form JSON (config, assertions) is a map or a slice, never this.
var untypedField = regexp.MustCompile(`(?m)^\t[A-Z]\w*\s+\*?interface\{\}`)

func TestAGoClientGeneratedFromTheDocumentsCompiles(t *testing.T) {
	// testdata/goclient/main.go uses each error's error as a string, upgrade as a bool,
	// the 403 union through its discriminator, a PATCH of one field, a create with a
	// config and a key's PATCH with null members; integration runs it against a
	// gateway.
	dir := openapitest.GoClient(t)
	for _, pkg := range []string{"v1", "dashboard"} {
		src, err := os.ReadFile(filepath.Join(dir, pkg, pkg+".gen.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range untypedField.FindAllString(string(src), -1) {
			t.Errorf("the generated package %s has an untyped field:%s", pkg, m)
		}
	}
	openapitest.Go(t, dir, "build", "./...")
	openapitest.Go(t, dir, "vet", "./...")
	// main_test.go: a key's PATCH sends null apart from leaving a member out.
	openapitest.Go(t, dir, "test", "-count=1", ".")
}
