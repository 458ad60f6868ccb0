package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// validateLog adapts a Caddyfile, validates it as `caddy validate` does (provisioning
// every handler, starting nothing), and returns what it logged.
func validateLog(t *testing.T, caddyfile string) string {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting:\n%s\n%v", caddyfile, err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
		"writer": map[string]any{"output": "file", "filename": logPath},
	}}}
	b, _ := json.Marshal(cfg)
	var c caddy.Config
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&c); err != nil {
		t.Fatalf("caddy validate:\n%s\n%v", caddyfile, err)
	}
	logged, _ := os.ReadFile(logPath)
	return string(logged)
}

// TestProvisionWarnsOfAHandlerUnderNoPathMatcher: v1_gateway_jwks and keygate_health
// answer every request that reaches them, so each warns where no path matcher is
// above it.
func TestProvisionWarnsOfAHandlerUnderNoPathMatcher(t *testing.T) {
	_, keyFile := gatewayauthtest.NewKey(t)
	for _, handler := range []string{"v1_gateway_jwks " + keyFile, "keygate_health"} {
		name, _, _ := strings.Cut(handler, " ")
		warning := name + " is under no path matcher"
		for _, tc := range []struct {
			name string
			site string // the site block's body
			warn bool
		}{
			{"at the site's top level", "HANDLER\nrespond 404", true},
			{"in a route without a matcher", "route {\n\tHANDLER\n}", true},
			{"in a handle without a matcher", "handle {\n\tHANDLER\n}", true},
			{"under a method matcher", "@get method GET\nhandle @get {\n\tHANDLER\n}", true},
			{"in handle /PATH", "handle /PATH {\n\tHANDLER\n}", false},
			{"under a named path matcher", "@it path /PATH\nhandle @it {\n\tHANDLER\n}", false},
			{"in a route nested in a handle with a path", "handle /PATH* {\n\troute {\n\t\tHANDLER\n\t}\n}", false},
			{"in a route with a path", "route /PATH {\n\tHANDLER\n}", false},
		} {
			t.Run(name+" "+tc.name, func(t *testing.T) {
				body := strings.NewReplacer("HANDLER", handler, "PATH", map[string]string{
					"v1_gateway_jwks": ".well-known/jwks.json", "keygate_health": "healthz"}[name]).Replace(tc.site)
				for _, site := range []string{"http://:" + freePortString(t), "http://localhost:" + freePortString(t)} {
					caddyfile := "{\n\tadmin off\n}\n\n" + site + " {\n" + body + "\n}\n"
					logged := validateLog(t, caddyfile)
					if got := strings.Contains(logged, warning); got != tc.warn {
						t.Errorf("site %s: warned %v, want %v; log:\n%s", site, got, tc.warn, logged)
					}
				}
			})
		}
	}
}

func TestProvisionWarnsOfAGatewayUnderHandlePath(t *testing.T) {
	d := newDB(t)
	const warning = "v1_gateway is under a rewrite that strips /v1 from the path"
	for _, tc := range []struct {
		name  string
		block string
		warn  bool
	}{
		{"handle_path /v1/*", "handle_path /v1/*", true},
		{"handle_path /api/v1/*", "handle_path /api/v1/*", true},
		{"handle /v1/*", "handle /v1/*", false},
		{"handle_path /api/*, which leaves /v1", "handle_path /api/*", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caddyfile := "{\n\tadmin off\n}\n\nhttp://:" + freePortString(t) + " {\n\t" + tc.block + " {\n" +
				"\t\tv1_gateway {\n\t\t\tdatabase_url " + d.url + "\n\t\t\tgateway_secret " + testSecret + "\n\t\t\tdisable_metrics\n\t\t}\n" +
				"\t\treverse_proxy 127.0.0.1:9\n\t}\n}\n"
			logged := validateLog(t, caddyfile)
			if got := strings.Contains(logged, warning); got != tc.warn {
				t.Errorf("warned %v, want %v; log:\n%s", got, tc.warn, logged)
			}
		})
	}
}

func freePortString(t *testing.T) string {
	addr := freeAddr(t)
	return addr[strings.LastIndexByte(addr, ':')+1:]
}
