#!/usr/bin/env bash
# release.sh cuts a release of keygate at HEAD (docs/development.md, Releasing):
#
#   scripts/release.sh v0.2.0
#
# In one commit, "Release v0.2.0", it
#   - moves CHANGELOG.md's [Unreleased] section into "## [0.2.0] - <today, UTC>",
#     leaving an empty [Unreleased] above it, and points the links at the new tag;
#   - has the README's commands for a published version name v0.2.0;
#   - has go.mod require github.com/keygate/keygate/gatewayauth at v0.2.0.
# Then it tags that commit v0.2.0 and gatewayauth/v0.2.0 (annotated tags), and prints
# the command that pushes them. It pushes nothing itself. A build at the tag names the
# release: scripts/version.sh prints the tag, make build stamps it into bin/upstream,
# and xcaddy.sh gives it to the module, which `caddy list-modules --versions` shows.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release.sh: $*" >&2; exit 1; }

v=${1:-}
[[ $v =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] ||
	die "usage: scripts/release.sh vX.Y.Z (a version of three numbers, such as v0.2.0)"
number=${v#v}
[ -z "$(git status --porcelain --untracked-files=no)" ] || die "the working tree has changes: commit or stash them first"
for tag in "$v" "gatewayauth/$v"; do
	! git rev-parse -q --verify "refs/tags/$tag" >/dev/null || die "the tag $tag exists"
done
grep -qx '## \[Unreleased\]' CHANGELOG.md || die "CHANGELOG.md has no '## [Unreleased]' section"
grep -qx "## \[$number\] - .*" CHANGELOG.md && die "CHANGELOG.md already has a section $number"
# The previous release: the first versioned section under [Unreleased].
prev=$(sed -n 's/^## \[\([0-9][0-9.]*\)\] - .*/\1/p' CHANGELOG.md | head -n1)
[ -n "$prev" ] || die "CHANGELOG.md names no previous release"
# The section must say what the release brings.
body=$(awk '/^## \[Unreleased\]$/ {inside=1; next} /^## \[/ {inside=0} inside && NF' CHANGELOG.md)
[ -n "$body" ] || die "CHANGELOG.md's [Unreleased] section is empty: nothing to release"

date=$(date -u +%F)
repo=https://github.com/keygate/keygate
awk -v number="$number" -v date="$date" -v prev="$prev" -v repo="$repo" '
	$0 == "## [Unreleased]" { print; print ""; print "## [" number "] - " date; next }
	/^\[Unreleased\]: / { print "[Unreleased]: " repo "/compare/v" number "...HEAD"
		print "[" number "]: " repo "/compare/v" prev "...v" number; next }
	{ print }' CHANGELOG.md >CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md
# The README's commands for a published version: caddymodule@…, gatewayauth@….
sed -i "s#\(github\.com/keygate/keygate/[a-z/]*@\)v$prev\b#\1$v#g" README.md
go mod edit -require="github.com/keygate/keygate/gatewayauth@$v"

git commit -q -am "Release $v"
git tag -a "$v" -m "keygate $v"
git tag -a "gatewayauth/$v" -m "keygate gatewayauth $v"
echo "release.sh: tagged $v and gatewayauth/$v at $(git rev-parse --short HEAD), which builds as $(VERSION= scripts/version.sh)"
echo "release.sh: push them with: git push origin HEAD $v gatewayauth/$v"
