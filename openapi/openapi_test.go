package openapi_test

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/keygate/keygate/openapi"
	"github.com/keygate/keygate/openapi/openapitest"
)

// load parses the document name of openapi.Files, resolving dashboard.yaml's
// references to v1.yaml; the tests validate it as OpenAPI 3.1 (kin-openapi's document
// validation, with JSON Schema 2020-12 for 3.1 documents).
func load(t testing.TB, name string) *openapi3.T {
	t.Helper()
	doc, err := openapitest.Load(name)
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
