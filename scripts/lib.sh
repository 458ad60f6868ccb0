# lib.sh: shell functions shared by stack.sh, run.sh and bench.sh. Source it; it
# expects the caller to have set -euo pipefail.

# free_port [LOW SPAN] prints a loopback TCP port in LOW..LOW+SPAN-1 nobody is
# listening on. The default, 20000..32767, lies below the kernel's ephemeral range
# (32768..), so that no outgoing connection can hold the port before its server
# binds it (a Sentinel once failed to start so).
free_port() {
	local low=${1:-20000} span=${2:-12768} p i
	for i in $(seq 1 200); do
		p=$((low + RANDOM % span))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "no free port found" >&2
	return 1
}

# stop_stack DIR kills the caller's background processes, listed in its array pids,
# waits for them, then stops the stack in DIR: the EXIT trap of run.sh and bench.sh.
stop_stack() {
	local pid
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	scripts/stack.sh down "$1"
}

# wait_http URL [SECONDS] waits until URL answers anything over HTTP.
wait_http() {
	local url=$1 secs=${2:-30} i
	for i in $(seq 1 $((secs * 10))); do
		if curl -s -o /dev/null --max-time 1 "$url"; then
			return 0
		fi
		sleep 0.1
	done
	echo "nothing answered at $url within ${secs}s" >&2
	return 1
}

# apt_install PACKAGE... installs Debian packages (apt-get update first, once a boot).
apt_install() {
	command -v apt-get >/dev/null || { echo "$* missing and apt-get unavailable: install it by hand" >&2; return 1; }
	echo "installing $* with apt-get" >&2
	if [ ! -f /tmp/.keygate-apt-updated ]; then
		apt_get update -qq >&2 && touch /tmp/.keygate-apt-updated
	fi
	apt_get install -y -qq --no-install-recommends "$@" >&2
}

# APT_LOCK_WAIT is how long, in seconds, apt_get waits for another apt-get or dpkg
# (an unattended upgrade at boot, another install) to let go of the package manager's
# locks; APT_LOCK_RETRY how often it tries again meanwhile.
APT_LOCK_WAIT=${APT_LOCK_WAIT:-900}
APT_LOCK_RETRY=${APT_LOCK_RETRY:-5}

# apt_get ARG... runs apt-get ARG... (through sudo when not root, non-interactive),
# waiting for the package manager's locks instead of failing at once: dpkg's through
# apt's own DPkg::Lock::Timeout, and those of the package lists and the download
# cache, which apt-get does not wait for, by trying again every APT_LOCK_RETRY
# seconds. Either way it gives up after APT_LOCK_WAIT seconds.
apt_get() {
	local sudo="" deadline=$((SECONDS + APT_LOCK_WAIT)) err rc
	[ "$(id -u)" = 0 ] || sudo="sudo"
	err=$(mktemp)
	while :; do
		rc=0
		$sudo env LC_ALL=C DEBIAN_FRONTEND=noninteractive \
			apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" "$@" 2>"$err" || rc=$?
		cat "$err" >&2
		if [ "$rc" = 0 ] || [ "$SECONDS" -ge "$deadline" ] ||
			! grep -qE 'Could not get lock|Unable to lock|Unable to acquire the dpkg' "$err"; then
			rm -f "$err"
			return "$rc"
		fi
		echo "apt-get: the package manager is busy (an unattended upgrade?); trying again in ${APT_LOCK_RETRY}s" >&2
		sleep "$APT_LOCK_RETRY"
	done
}

# need_tools COMMAND... installs the Debian packages of the same names for the
# commands that are missing.
need_tools() {
	local missing=() c
	for c in "$@"; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

# login EMAIL PASSWORD JAR BASE logs in through BASE and keeps the session in JAR. The
# body goes through standard input, so the password is in no command line ps shows.
login() {
	printf '{"email":"%s","password":"%s"}' "$1" "$2" |
		curl -sf -c "$3" -o /dev/null -H 'Content-Type: application/json' --data-binary @- "$4/auth/login"
}

# create_key ORG NAME ROLE JAR BASE [MEMBERS] creates a key through the dashboard route
# and prints the full key. MEMBERS are more JSON members of the request, such as
# "scopes":["monitors:read"].
create_key() {
	local out
	out=$(curl -sf -b "$4" -H 'Content-Type: application/json' \
		-d "{\"name\":\"$2\",\"role\":\"$3\"${6:+,$6}}" "$5/orgs/$1/api-keys")
	json_field key <<<"$out"
}

# json_field NAME prints the string or number field NAME of the JSON object on stdin.
json_field() {
	sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n1
}

# shown_password PASSWORD TERMINAL prints how make run shows the demo owner's
# password: itself when its output is a terminal (TERMINAL 1); otherwise, in a file, a
# pipe or a CI log, how to know it: the DEMO_PASSWORD that was set, or how to set one.
shown_password() {
	if [ "$2" = 1 ]; then
		printf '%s\n' "$1"
	elif [ -n "${DEMO_PASSWORD:-}" ]; then
		echo "<the DEMO_PASSWORD you set>"
	else
		echo "<the password: printed only to a terminal; set DEMO_PASSWORD to choose it>"
	fi
}

# stage NAME COMMAND... runs COMMAND as a stage of a long script (make test): it says
# when the stage starts and, when it ends, how long it took and how long the script
# has run, so that minutes of go vet or of compiling are never silent. It returns
# COMMAND's status.
stage() {
	local name=$1 start=$SECONDS rc=0
	shift
	echo "==> $name"
	"$@" || rc=$?
	if [ "$rc" = 0 ]; then
		echo "==> $name: done in $(duration $((SECONDS - start))) ($(duration "$SECONDS") in all)"
	else
		echo "==> $name: FAILED (exit $rc) after $(duration $((SECONDS - start))) ($(duration "$SECONDS") in all)"
	fi
	return "$rc"
}

# duration SECONDS prints SECONDS as 7s or 2m05s.
duration() {
	if [ "$1" -lt 60 ]; then
		echo "${1}s"
	else
		printf '%dm%02ds\n' $(($1 / 60)) $(($1 % 60))
	fi
}
