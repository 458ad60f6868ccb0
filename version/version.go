// Package version is the version of keygate's binaries. make build stamps it into
// bin/upstream with -ldflags "-X github.com/keygate/keygate/version.stamped=v0.1.0",
// from scripts/version.sh. A Caddy built with xcaddy has no such flag: there the
// version is the one Go's build info records for the module github.com/keygate/keygate,
// which xcaddy.sh's --with …/caddymodule@VERSION sets, and which
// `caddy list-modules --versions` shows too.
package version

import "runtime/debug"

// Module is the path of the module whose version String reports.
const Module = "github.com/keygate/keygate"

// devel is what String reports when nothing names a version, as Go itself does for a
// main module built without one.
const devel = "(devel)"

// stamped is set at link time (-ldflags -X). Empty when the build did not set it.
var stamped string

// String returns the version of this binary: the one stamped at link time, else the
// version of Module in the build info, else "(devel)".
func String() string {
	if stamped != "" {
		return stamped
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return devel
	}
	return fromBuildInfo(info)
}

// fromBuildInfo returns the version of Module in info: the main module's when this is
// a keygate binary, a dependency's when the module is built into another program
// (Caddy). A replaced dependency keeps the version it was required at.
func fromBuildInfo(info *debug.BuildInfo) string {
	if info.Main.Path == Module && info.Main.Version != "" {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == Module && d.Version != "" {
			return d.Version
		}
	}
	return devel
}
