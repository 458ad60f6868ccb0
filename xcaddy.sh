#!/usr/bin/env bash
# xcaddy.sh builds bin/caddy: Caddy with the v1_gateway module from this working tree.
#
#   ./xcaddy.sh                  # writes bin/caddy
#   OUTPUT=/path/caddy ./xcaddy.sh
#
# It runs the README's build command for a local checkout (README.md, "Build"):
#   xcaddy build v2.11.9 --with github.com/keygate/keygate/caddymodule@VERSION \
#     --replace github.com/keygate/keygate@VERSION=<checkout> \
#     --replace github.com/keygate/keygate/gatewayauth=<checkout>/gatewayauth
# xcaddy is pinned as a Go tool in go.mod, so `go tool xcaddy` needs no install.
#
# The plugin is the package caddymodule, inside the module github.com/keygate/keygate:
# --with names the package (xcaddy imports it), --replace points the whole module at
# this working tree (a replacement given with --with would apply to the package path,
# which is not a module). gatewayauth, which the module uses to sign, is a module of
# its own in gatewayauth/: a go.mod's replace directives bind only its own builds, not
# xcaddy's, so it needs its own --replace.
#
# VERSION, scripts/version.sh's (the tag at HEAD, or Go's pseudo-version of HEAD), is
# the version the build requires the module at, so Go's build info records it and
# `caddy list-modules --versions` shows it. It takes both lines: --with …@VERSION
# names it, and the replacement must be of that version, …@VERSION=<checkout>: xcaddy
# skips the `go get` of a plugin whose module has a replacement without a version,
# and Go then records the zero pseudo-version, v0.0.0-00010101000000-000000000000. The
# form --with module@version=path does not serve either: its replacement applies to
# the package path, as above.
set -euo pipefail
cd "$(dirname "$0")"

# CADDY_VERSION is the Caddy release the module is built and tested against; keep it
# equal to the caddy version in go.mod.
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
OUTPUT=${OUTPUT:-bin/caddy}
VERSION=${VERSION:-$(scripts/version.sh)}

# Importing the plugin package makes `go get` ask whether
# github.com/keygate/keygate/caddymodule is a module of its own, although the
# replacement below (this tree) is what gets built. A module proxy that answers with an
# error rather than "not found" (403 behind some filtering proxies), or a "direct" VCS
# lookup that cannot reach github.com, stops the build. So the build asks the
# configured proxies only, and takes any error of theirs as "not found" ('|' and a
# final 'off'). Everything it downloads (Caddy and its dependencies) is on the proxy.
proxies=$(go env GOPROXY | tr ',|' '\n\n' | grep -vx -e direct -e off | paste -sd '|' - || true)
if [ -n "$proxies" ]; then
	export GOPROXY="$proxies|off"
fi

mkdir -p "$(dirname "$OUTPUT")"
# xcaddy says little while Go compiles, which can take minutes: say what is built and,
# at the end, how long it took.
start=$SECONDS
echo "xcaddy.sh: building $OUTPUT: Caddy $CADDY_VERSION with github.com/keygate/keygate/caddymodule $VERSION from $PWD" \
	"(about 5 minutes on two cores the first time, under 1 with warm Go caches)" >&2
# XCADDY_SKIP_CLEANUP=0 removes xcaddy's temporary build folder afterwards.
XCADDY_SKIP_CLEANUP=0 go tool xcaddy build "$CADDY_VERSION" \
	--with "github.com/keygate/keygate/caddymodule@$VERSION" \
	--replace "github.com/keygate/keygate@$VERSION=$PWD" \
	--replace "github.com/keygate/keygate/gatewayauth=$PWD/gatewayauth" \
	--output "$OUTPUT"

# The build must contain the module; fail here rather than at the first config load.
if ! "$OUTPUT" list-modules | grep -x 'http.handlers.v1_gateway' >/dev/null; then
	echo "xcaddy.sh: $OUTPUT lacks http.handlers.v1_gateway" >&2
	exit 1
fi
echo "xcaddy.sh: built $OUTPUT in $((SECONDS - start))s: $("$OUTPUT" list-modules --versions | grep '^http.handlers.v1_gateway ')" >&2
