#!/usr/bin/env bash
# openapi-check.sh holds openapi/v1.yaml and openapi/dashboard.yaml to what client
# generators need (docs/openapi.md): it lints both with Redocly CLI's recommended rules
# and openapi/redocly.yaml's own, then generates TypeScript types from both with
# openapi-typescript and type-checks openapi/testdata/tsclient/client.ts, a client
# written with openapi-fetch, with tsc --strict. (go test ./openapi does the same for Go
# with oapi-codegen.)
#
# The npm packages, pinned by openapi/testdata/tsclient/package-lock.json, are
# installed once per lock into a cache outside the repository: $KEYGATE_NPM_CACHE, by
# default ~/.cache/keygate/openapi-npm.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null; then
	echo "openapi-check: needs Node.js (20.19 or later, or 22.12 or later) and npm" >&2
	exit 1
fi
src=openapi/testdata/tsclient
lock=$(sha256sum "$src/package-lock.json" | cut -c1-16)
tools=${KEYGATE_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keygate/openapi-npm}/$lock
if [ ! -x "$tools/node_modules/.bin/tsc" ]; then
	echo "openapi-check: installing the npm packages of $src into $tools"
	tmp=$tools.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp"
	cp "$src/package.json" "$src/package-lock.json" "$tmp/"
	(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
	# Another run may have finished first; either copy will do.
	mv -T "$tmp" "$tools" 2>/dev/null || rm -rf "$tmp"
fi
bin=$tools/node_modules/.bin
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true

# redocly runs Redocly CLI without the boxed notice that Node.js 20 reached its end of
# life, which every command prints on standard error under Node.js 20 and which no
# option or variable turns off. The pinned version supports Node.js 20; the notice
# concerns releases after it. Any other box, and everything else, passes.
redocly() {
	{ "$bin/redocly" "$@" 2>&1 1>&3 | drop_node_notice >&2; } 3>&1
}
drop_node_notice() {
	awk '
		/╔/ { box = $0 "\n"; inbox = 1; next }
		inbox { box = box $0 "\n"; if (/╚/) { inbox = 0; if (box !~ /Node\.js/) printf "%s", box }; next }
		{ print }
		END { if (inbox) printf "%s", box }'
}

# Both checks run, and either failing fails the script. Redocly CLI finds
# openapi/redocly.yaml in the working directory.
failed=
(cd openapi && redocly lint --format=stylish v1.yaml dashboard.yaml) || failed="the lint"

work=$(mktemp -d "${TMPDIR:-/tmp}/keygate-tsclient.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$src/client.ts" "$src/tsconfig.json" "$work/"
ln -s "$tools/node_modules" "$work/node_modules"
"$bin/openapi-typescript" openapi/v1.yaml -o "$work/v1.ts"
"$bin/openapi-typescript" openapi/dashboard.yaml -o "$work/dashboard.ts"
"$bin/tsc" -p "$work" || failed="${failed:+$failed and }the TypeScript client"
if [ -n "$failed" ]; then
	echo "openapi-check: $failed failed" >&2
	exit 1
fi
echo "openapi-check: both documents lint clean, and a strict TypeScript client of them type-checks"
