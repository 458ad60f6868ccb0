#!/usr/bin/env bash
# version.sh prints the version of this checkout, the one the builds stamp into
# bin/upstream (-ldflags -X) and give bin/caddy's module (xcaddy's --with …@version):
#
#   VERSION, when set: a release build names its own (v0.1.0);
#   the tag vX.Y.Z, when HEAD is one;
#   otherwise Go's pseudo-version of HEAD, as `go list -m` would name that commit:
#   v0.0.0-20261127171817-bd2dd8c37359 with no tag before it, v0.1.1-0.2026…-… after
#   v0.1.0.
#
# Changes not yet committed are not marked. Without git it prints the zero
# pseudo-version, v0.0.0-00010101000000-000000000000, which Go gives a module it has no
# version for.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${VERSION:-}" ]; then
	echo "$VERSION"
	exit 0
fi
if ! head=$(git rev-parse --verify -q HEAD 2>/dev/null); then
	echo v0.0.0-00010101000000-000000000000
	exit 0
fi
if tag=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null); then
	echo "$tag"
	exit 0
fi
when=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
hash=${head:0:12}
if last=$(git describe --tags --abbrev=0 --match 'v[0-9]*' HEAD 2>/dev/null); then
	if [[ $last == *-* ]]; then
		echo "$last.0.$when-$hash" # after a pre-release: v0.2.0-rc.1.0.…
	else
		IFS=. read -r major minor patch <<<"${last#v}"
		echo "v$major.$minor.$((patch + 1))-0.$when-$hash"
	fi
else
	echo "v0.0.0-$when-$hash"
fi
