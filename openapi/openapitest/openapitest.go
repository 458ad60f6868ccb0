// Package openapitest loads the documents of package openapi with kin-openapi, and
// generates a Go client of them with oapi-codegen (GoClient), for the tests that check
// them and check the code against them. It lives apart from openapi so that the
// programs serving the documents do not link kin-openapi.
package openapitest

import (
	"net/url"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/keygate/keygate/openapi"
)

// Load parses the document name of openapi.Files (one of openapi.Names), resolving
// its references to the other documents there, as dashboard.yaml's to v1.yaml's
// schemas. It does not validate the document.
func Load(name string) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		return openapi.Files.ReadFile(u.Path)
	}
	return loader.LoadFromURI(&url.URL{Path: name})
}
