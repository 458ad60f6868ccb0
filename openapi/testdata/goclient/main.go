// Command goclient is what a client developer writes against the Go clients that
// oapi-codegen generates from openapi/v1.yaml (package goclient/v1) and
// openapi/dashboard.yaml (package goclient/dashboard, which imports goclient/v1). The
// generated packages are not kept here: the openapi tests generate them beside a copy
// of this file, compile the whole (so that a document that generates an untyped member
// fails), and run it against a real gateway.
//
// Run, it logs in at the dashboard as an Owner of -org (a plan with the API, http
// monitors and us-east, without icmp), creates an Admin and a Viewer key, and uses
// them on /v1: a create with a config, a PATCH of one field, and the typed error bodies
// of 400, 402, 403 and 404. Before that it narrows the Viewer key's scopes and gives
// them back with {"scopes":null}. It exits 1, saying why, when an answer is not what
// the documents promise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/oapi-codegen/nullable"
	openapi_types "github.com/oapi-codegen/runtime/types"

	"goclient/dashboard"
	v1 "goclient/v1"
)

func main() {
	base := flag.String("url", "", "the gateway's base URL, for example http://127.0.0.1:8080")
	email := flag.String("email", "", "an Owner's email")
	password := flag.String("password", "", "the Owner's password")
	org := flag.String("org", "", "the Owner's organisation")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, *base, *email, *password, *org); err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, base, email, password, orgText string) error {
	var org openapi_types.UUID
	if err := org.UnmarshalText([]byte(orgText)); err != nil {
		return fmt.Errorf("-org: %v", err)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		return err
	}
	dash, err := dashboard.NewClientWithResponses(base, dashboard.WithHTTPClient(&http.Client{Jar: jar}))
	if err != nil {
		return err
	}
	login, err := dash.LoginWithResponse(ctx, dashboard.LoginJSONRequestBody{Email: email, Password: password})
	if err != nil {
		return err
	}
	if login.StatusCode() != http.StatusNoContent {
		return unexpected("login", login.HTTPResponse, login.Body)
	}
	_, admin, err := createKey(ctx, dash, org, v1.Admin)
	if err != nil {
		return err
	}
	viewerID, viewer, err := createKey(ctx, dash, org, v1.Viewer)
	if err != nil {
		return err
	}
	if err := scopeKey(ctx, dash, org, viewerID); err != nil {
		return err
	}
	api, err := v1.NewClientWithResponses(base, v1.WithRequestEditorFn(bearer(admin)))
	if err != nil {
		return err
	}
	readOnly, err := v1.NewClientWithResponses(base, v1.WithRequestEditorFn(bearer(viewer)))
	if err != nil {
		return err
	}
	return useMonitors(ctx, api, readOnly)
}

// createKey creates a key of role in org through the dashboard and returns its id and
// the full key.
func createKey(ctx context.Context, dash *dashboard.ClientWithResponses, org openapi_types.UUID, role v1.Role) (id, key string, err error) {
	r, err := dash.CreateApiKeyWithResponse(ctx, org, dashboard.CreateApiKeyJSONRequestBody{Name: "goclient " + string(role), Role: role})
	if err != nil {
		return "", "", err
	}
	if r.JSON201 == nil {
		if r.JSON403 != nil {
			return "", "", forbidden("create key", *r.JSON403)
		}
		return "", "", unexpected("create key", r.HTTPResponse, r.Body)
	}
	if r.JSON201.Role != role || !strings.Contains(r.JSON201.Key, "_live_") {
		return "", "", fmt.Errorf("create key: a %s key answered as role %s", role, r.JSON201.Role)
	}
	return r.JSON201.Id, r.JSON201.Key, nil
}

// scopeKey narrows the key id of org to monitors:read, changes its rate limit while
// leaving its scopes out, and then sends both as null: the key has everything its role
// allows and the plan's rate limit again. A nullable.Nullable tells a member left out
// from one sent as null.
func scopeKey(ctx context.Context, dash *dashboard.ClientWithResponses, org openapi_types.UUID, id string) error {
	for _, step := range []struct {
		what      string
		body      dashboard.ApiKeyUpdate
		scopes    []dashboard.Scope // nil: null
		rateLimit int               // 0: null
	}{
		{"PATCH scopes", dashboard.ApiKeyUpdate{Scopes: nullable.NewNullableWithValue(dashboard.KeyScopes{"monitors:read"})},
			[]dashboard.Scope{"monitors:read"}, 0},
		{"PATCH the rate limit alone", dashboard.ApiKeyUpdate{RateLimit: nullable.NewNullableWithValue(30)},
			[]dashboard.Scope{"monitors:read"}, 30},
		{"PATCH scopes and rate limit null", dashboard.ApiKeyUpdate{Scopes: nullable.NewNullNullable[dashboard.KeyScopes](),
			RateLimit: nullable.NewNullNullable[dashboard.KeyRateLimit]()}, nil, 0},
	} {
		r, err := dash.UpdateApiKeyWithResponse(ctx, org, id, step.body)
		if err != nil {
			return err
		}
		if r.JSON200 == nil {
			return unexpected(step.what, r.HTTPResponse, r.Body)
		}
		k := r.JSON200
		scopes, _ := k.Scopes.Get()
		rateLimit, _ := k.RateLimit.Get()
		if k.Scopes.IsNull() != (step.scopes == nil) || !slices.Equal(scopes, step.scopes) ||
			k.RateLimit.IsNull() != (step.rateLimit == 0) || rateLimit != step.rateLimit {
			return fmt.Errorf("%s: scopes %v (null %t), rate limit %d (null %t); want %v, %d",
				step.what, scopes, k.Scopes.IsNull(), rateLimit, k.RateLimit.IsNull(), step.scopes, step.rateLimit)
		}
	}
	return nil
}

func bearer(key string) v1.RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+key)
		return nil
	}
}

// useMonitors writes through api (an Admin key) and readOnly (a Viewer key).
func useMonitors(ctx context.Context, api, readOnly *v1.ClientWithResponses) error {
	me, err := api.GetMeWithResponse(ctx)
	if err != nil {
		return err
	}
	if me.JSON200 == nil || me.JSON200.Role != v1.Admin || me.JSON200.Limits.PerMinute.IsNull() || me.JSON200.Limits.PerMinute.MustGet() < 1 {
		return unexpected("GET /v1/me", me.HTTPResponse, me.Body)
	}

	interval := 120
	created, err := api.CreateMonitorWithResponse(ctx, v1.MonitorCreate{
		Name:            "goclient",
		Type:            v1.Http,
		Target:          "https://example.com/health",
		IntervalSeconds: &interval,
		Config:          &v1.MonitorConfig{"method": "GET", "headers": map[string]any{"X-Probe": "1"}, "retries": 3},
		Assertions:      &v1.MonitorAssertions{map[string]any{"type": "status", "equals": 200}},
	})
	if err != nil {
		return err
	}
	if created.JSON201 == nil {
		return unexpected("create", created.HTTPResponse, created.Body)
	}
	m := *created.JSON201
	if m.IntervalSeconds != interval || !slices.Equal(m.Locations, []v1.Location{v1.UsEast}) || m.Paused {
		return fmt.Errorf("create: got interval %d, locations %v, paused %t; want %d, the default [us-east], false",
			m.IntervalSeconds, m.Locations, m.Paused, interval)
	}

	// A PATCH of one field leaves the others as they are.
	name := "goclient renamed"
	patched, err := api.UpdateMonitorWithResponse(ctx, m.Id, v1.MonitorUpdate{Name: &name})
	if err != nil {
		return err
	}
	if patched.JSON200 == nil {
		return unexpected("PATCH name", patched.HTTPResponse, patched.Body)
	}
	if p := patched.JSON200; p.Name != name || p.IntervalSeconds != interval || !slices.Equal(p.Locations, m.Locations) {
		return fmt.Errorf("PATCH name: got %q, interval %d, locations %v; want %q and the rest unchanged", p.Name, p.IntervalSeconds, p.Locations, name)
	}

	// 400: error and message are strings.
	bad, err := api.UpdateMonitorWithResponse(ctx, m.Id, v1.MonitorUpdate{Target: ptr("example.com")})
	if err != nil {
		return err
	}
	if bad.JSON400 == nil {
		return unexpected("PATCH a bad target", bad.HTTPResponse, bad.Body)
	}
	if got := describe(string(bad.JSON400.Error), bad.JSON400.Message); got != "invalid_request: target: must be an absolute http or https URL with a host for type http" {
		return fmt.Errorf("PATCH a bad target: %s", got)
	}

	// 402: upgrade is a bool, metric names the quota.
	tooOften := 10
	quota, err := api.UpdateMonitorWithResponse(ctx, m.Id, v1.MonitorUpdate{IntervalSeconds: &tooOften})
	if err != nil {
		return err
	}
	if q := quota.JSON402; q == nil || !q.Upgrade || q.Error != v1.ErrorQuotaExceededErrorQuotaExceeded || q.Metric != v1.MinIntervalSeconds {
		return unexpected("PATCH an interval below the plan's", quota.HTTPResponse, quota.Body)
	}

	// 403: the body is told apart by its error.
	icmp := v1.Icmp
	gated, err := api.UpdateMonitorWithResponse(ctx, m.Id, v1.MonitorUpdate{Type: &icmp, Target: ptr("192.0.2.1")})
	if err != nil {
		return err
	}
	if gated.JSON403 == nil {
		return unexpected("PATCH to a check type outside the plan", gated.HTTPResponse, gated.Body)
	}
	if err := wantFeatureGated(*gated.JSON403, "check_type:icmp"); err != nil {
		return fmt.Errorf("PATCH to a check type outside the plan: %v", err)
	}
	refused, err := readOnly.UpdateMonitorWithResponse(ctx, m.Id, v1.MonitorUpdate{Paused: ptr(true)})
	if err != nil {
		return err
	}
	if refused.JSON403 == nil {
		return unexpected("PATCH with a Viewer key", refused.HTTPResponse, refused.Body)
	}
	if kind, err := refused.JSON403.Discriminator(); err != nil || kind != "forbidden" {
		return fmt.Errorf("PATCH with a Viewer key: a 403 %q (%v), want forbidden", kind, err)
	}

	// The refused writes changed nothing; 404 has a human-readable error.
	got, err := api.GetMonitorWithResponse(ctx, m.Id)
	if err != nil {
		return err
	}
	if got.JSON200 == nil || got.JSON200.Name != name || got.JSON200.IntervalSeconds != interval || got.JSON200.Type != v1.Http || got.JSON200.Paused {
		return unexpected("GET after the refused writes", got.HTTPResponse, got.Body)
	}
	deleted, err := api.DeleteMonitorWithResponse(ctx, m.Id)
	if err != nil {
		return err
	}
	if deleted.StatusCode() != http.StatusNoContent {
		return unexpected("DELETE", deleted.HTTPResponse, deleted.Body)
	}
	gone, err := api.GetMonitorWithResponse(ctx, m.Id)
	if err != nil {
		return err
	}
	if gone.JSON404 == nil || gone.JSON404.Error == "" {
		return unexpected("GET a deleted monitor", gone.HTTPResponse, gone.Body)
	}
	return nil
}

// wantFeatureGated checks that body is a feature_gated 403 for feature.
func wantFeatureGated(body v1.ErrorForbiddenOrFeatureGated, feature string) error {
	kind, err := body.Discriminator()
	if err != nil {
		return err
	}
	if kind != "feature_gated" {
		return fmt.Errorf("a 403 %q, want feature_gated", kind)
	}
	g, err := body.AsErrorFeatureGated()
	if err != nil {
		return err
	}
	if g.Feature != feature || !g.Upgrade {
		return fmt.Errorf("feature %q, upgrade %t; want %q, true", g.Feature, g.Upgrade, feature)
	}
	return nil
}

// forbidden describes an unexpected 403.
func forbidden(what string, body v1.ErrorForbiddenOrFeatureGated) error {
	kind, err := body.Discriminator()
	if err != nil {
		return fmt.Errorf("%s: a 403 without error: %v", what, err)
	}
	return errors.New(what + ": 403 " + kind)
}

func describe(code, message string) string { return code + ": " + message }

func unexpected(what string, res *http.Response, body []byte) error {
	return fmt.Errorf("%s: unexpected answer %s: %s", what, res.Status, body)
}

func ptr[T any](v T) *T { return &v }
