// Package openapi holds the OpenAPI 3.1 documents of keygate's two HTTP interfaces:
// v1.yaml, the public /v1 API through the gateway, and dashboard.yaml, the upstream's
// session API. The upstream serves them byte for byte at /openapi/v1.yaml and
// /openapi/dashboard.yaml; dashboard.yaml refers to v1.yaml's schemas by that relative
// name, so the two are served side by side.
//
// The end-to-end suite (integration/) checks every request it sends and every answer
// it gets against them, so they cannot drift from the code.
package openapi

import "embed"

// Files holds v1.yaml and dashboard.yaml.
//
//go:embed v1.yaml dashboard.yaml
var Files embed.FS

// Names are the documents in Files.
var Names = []string{"v1.yaml", "dashboard.yaml"}
