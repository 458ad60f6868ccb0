package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"a keygate binary built from a tag",
			debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v0.1.0"}}, "v0.1.0"},
		{"a keygate binary built without a version",
			debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, "(devel)"},
		{"Caddy with the module replaced by a checkout",
			debug.BuildInfo{Main: debug.Module{Path: "caddy", Version: "(devel)"}, Deps: []*debug.Module{
				{Path: "github.com/caddyserver/caddy/v2", Version: "v2.11.9"},
				{Path: Module + "/gatewayauth", Version: "v0.0.0-20261127171817-bd2dd8c37359"},
				{Path: Module, Version: "v0.0.0-20261127171817-bd2dd8c37359", Replace: &debug.Module{Path: "/src/keygate"}},
			}}, "v0.0.0-20261127171817-bd2dd8c37359"},
		{"Caddy with a published module",
			debug.BuildInfo{Main: debug.Module{Path: "caddy"}, Deps: []*debug.Module{{Path: Module, Version: "v0.1.0"}}}, "v0.1.0"},
		{"a program without the module",
			debug.BuildInfo{Main: debug.Module{Path: "example.com/other", Version: "v1.2.3"}}, "(devel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(&tc.info); got != tc.want {
				t.Errorf("fromBuildInfo = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStringPrefersTheStampedVersion(t *testing.T) {
	defer func(s string) { stamped = s }(stamped)
	stamped = "v9.8.7"
	if got := String(); got != "v9.8.7" {
		t.Errorf("String() = %q with v9.8.7 stamped", got)
	}
}
