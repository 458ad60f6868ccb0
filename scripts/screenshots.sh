#!/usr/bin/env bash
# screenshots.sh is `make screenshots`: it makes docs/dashboard/*.png again. The
# browser tests that drive the dashboard take them (docs/dashboard.md, Screenshots):
# this builds, starts a throwaway PostgreSQL and Redis, runs those tests with
# KEYGATE_SCREENSHOTS=docs/dashboard, and stops the servers. It fails, naming them,
# when a screenshot of docs/dashboard/ is one no test took again: a page the docs
# show must be one a test drives.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
[ -x /usr/bin/chromium ] || apt_install chromium

# The tests that take screenshots: each calls the tab's screenshot method.
tests='TestDashboardInABrowser|TestTheKeysTableFitsWithSixLongKeys|TestWebhooksInABrowser'

make -s build
stack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-screenshots.XXXXXX")
trap 'scripts/stack.sh down "$stack"' EXIT
scripts/stack.sh up "$stack" >/dev/null
# shellcheck disable=SC1091
source "$stack/env"
export DATABASE_URL REDIS_URL STACK_DIR="$stack"

marker="$stack/started"
touch "$marker"
KEYGATE_SCREENSHOTS=docs/dashboard go test -count=1 ./integration -run "^($tests)\$"
stale=$(find docs/dashboard -name '*.png' ! -newer "$marker" | sort)
if [ -n "$stale" ]; then
	echo "screenshots.sh: no test took these again; remove them or take them in a test:" >&2
	echo "$stale" >&2
	exit 1
fi
echo "screenshots.sh: $(find docs/dashboard -name '*.png' | wc -l) screenshots in docs/dashboard"
