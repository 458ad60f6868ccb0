package openapi_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/keygate/keygate/openapi"
)

// Load parses the documents in openapi.Files, resolving dashboard.yaml's references
// to v1.yaml, and validates them as OpenAPI 3.1 (kin-openapi's document validation,
// with JSON Schema 2020-12 for 3.1 documents).
func load(t *testing.T, name string) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		return openapi.Files.ReadFile(u.Path)
	}
	doc, err := loader.LoadFromURI(&url.URL{Path: name})
	if err != nil {
		t.Fatalf("loading %s: %v", name, err)
	}
	return doc
}

func TestTheDocumentsAreValidOpenAPI31(t *testing.T) {
	for _, name := range openapi.Names {
		t.Run(name, func(t *testing.T) {
			doc := load(t, name)
			if !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
				t.Errorf("%s is OpenAPI %s, want 3.1", name, doc.OpenAPI)
			}
			if err := doc.Validate(context.Background()); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			for path, item := range doc.Paths.Map() {
				for method, op := range item.Operations() {
					if op.OperationID == "" {
						t.Errorf("%s %s has no operationId", method, path)
					}
				}
			}
		})
	}
}
