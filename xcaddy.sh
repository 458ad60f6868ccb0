#!/usr/bin/env bash
# xcaddy.sh builds bin/caddy: Caddy with the v1_gateway module from this working tree.
#
#   ./xcaddy.sh                  # writes bin/caddy
#   OUTPUT=/path/caddy ./xcaddy.sh
#
# Platform teams building their own Caddy do the same with
#   xcaddy build v2.11.9 --with github.com/keygate/keygate@<version>
# xcaddy is pinned as a Go tool in go.mod, so `go tool xcaddy` needs no install.
set -euo pipefail
cd "$(dirname "$0")"

# CADDY_VERSION is the Caddy release the module is built and tested against; keep it
# equal to the caddy version in go.mod.
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
OUTPUT=${OUTPUT:-bin/caddy}

mkdir -p "$(dirname "$OUTPUT")"
# XCADDY_SKIP_CLEANUP=0 removes xcaddy's temporary build folder afterwards.
XCADDY_SKIP_CLEANUP=0 go tool xcaddy build "$CADDY_VERSION" \
	--with "github.com/keygate/keygate=$PWD" \
	--output "$OUTPUT"
