package main

import (
	"encoding/json"
	"testing"

	"github.com/oapi-codegen/nullable"

	"goclient/dashboard"
)

// TestAKeyPatchSendsNullApartFromLeavingOut marshals the body of a key's PATCH: a
// member left out is absent and keeps the setting, a member set to null is sent as
// null and clears it.
func TestAKeyPatchSendsNullApartFromLeavingOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		body dashboard.ApiKeyUpdate
		want string
	}{
		{"scopes left out", dashboard.ApiKeyUpdate{RateLimit: nullable.NewNullableWithValue(30)}, `{"rate_limit":30}`},
		{"scopes null", dashboard.ApiKeyUpdate{Scopes: nullable.NewNullNullable[dashboard.KeyScopes]()}, `{"scopes":null}`},
		{"scopes listed", dashboard.ApiKeyUpdate{Scopes: nullable.NewNullableWithValue(dashboard.KeyScopes{"monitors:read"})},
			`{"scopes":["monitors:read"]}`},
		{"rate limit null", dashboard.ApiKeyUpdate{RateLimit: nullable.NewNullNullable[dashboard.KeyRateLimit]()}, `{"rate_limit":null}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("body %s, want %s", b, tc.want)
			}
		})
	}
}
