#!/usr/bin/env bash
# stack.sh brings up a throwaway PostgreSQL and Redis on free loopback ports, for
# tests, benchmarks and `make run`, and tears them down again.
#
#   scripts/stack.sh up DIR        start both (unless DATABASE_URL / REDIS_URL are set),
#                                  write DIR/env with DATABASE_URL and REDIS_URL
#   scripts/stack.sh down DIR      stop what `up` started and remove DIR
#   scripts/stack.sh stop-pg DIR | start-pg DIR | stop-redis DIR | start-redis DIR
#                                  stop or restart one server on the same port (fault tests)
#
# It installs redis-server and PostgreSQL with apt-get when they are missing, and runs
# PostgreSQL as the postgres user when invoked as root (PostgreSQL refuses to run as root).
# The servers are tuned for tests (no fsync); they are not for production data.
set -euo pipefail

die() { echo "stack.sh: $*" >&2; exit 1; }
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: stack.sh up|down|stop-pg|start-pg|stop-redis|start-redis DIR"

# pg_bindir prints the directory holding initdb/pg_ctl, installing PostgreSQL if needed.
pg_bindir() {
	local d
	for d in "$(pg_config --bindir 2>/dev/null || true)" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -Vr); do
		if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return
		fi
	done
	apt_install postgresql
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -Vr | head -n1)
	[ -x "$d/initdb" ] || die "PostgreSQL server binaries not found after install"
	echo "$d"
}

redis_bin() {
	command -v redis-server >/dev/null || apt_install redis-server
	command -v redis-server
}

# as_pg runs a command as the postgres user when we are root.
as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

wait_port() {
	local port=$1 what=$2 i
	for i in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	die "$what did not start listening on port $port"
}

start_pg() {
	local bindir port
	bindir=$(cat "$dir/pg.bindir")
	port=$(cat "$dir/pg.port")
	as_pg "$bindir/pg_ctl" -D "$dir/pg" -l "$dir/pg/log" -w -t 30 \
		-o "-p $port -c listen_addresses=127.0.0.1 -k $dir/pg" start >/dev/null
}

stop_pg() {
	[ -f "$dir/pg.bindir" ] || return 0
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
}

start_redis() {
	local port
	port=$(cat "$dir/redis.port")
	"$(cat "$dir/redis.bin")" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize yes --pidfile "$dir/redis/redis.pid" --logfile "$dir/redis/redis.log" \
		--dir "$dir/redis" --protected-mode no
	wait_port "$port" redis
}

stop_redis() {
	[ -f "$dir/redis/redis.pid" ] || return 0
	local pid i
	pid=$(cat "$dir/redis/redis.pid")
	kill "$pid" 2>/dev/null || true
	for i in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	rm -f "$dir/redis/redis.pid"
}

up() {
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	: >"$dir/env"
	if [ -n "${DATABASE_URL:-}" ]; then
		echo "export DATABASE_URL='$DATABASE_URL'" >>"$dir/env"
	else
		local bindir port
		bindir=$(pg_bindir)
		port=$(free_port)
		echo "$bindir" >"$dir/pg.bindir"
		echo "$port" >"$dir/pg.port"
		mkdir -p "$dir/pg"
		[ "$(id -u)" = 0 ] && chown postgres "$dir" "$dir/pg"
		chmod 700 "$dir/pg"
		as_pg "$bindir/initdb" -D "$dir/pg" -U keygate --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
			{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
		cat >>"$dir/pg/postgresql.conf" <<-EOF
			fsync = off
			synchronous_commit = off
			full_page_writes = off
			max_connections = 300
			shared_buffers = 128MB
		EOF
		start_pg
		as_pg "$bindir/psql" -h 127.0.0.1 -p "$port" -U keygate -d postgres -qAt \
			-c "CREATE DATABASE keygate" >/dev/null
		echo "export DATABASE_URL='postgres://keygate@127.0.0.1:$port/keygate?sslmode=disable'" >>"$dir/env"
	fi
	if [ -n "${REDIS_URL:-}" ]; then
		echo "export REDIS_URL='$REDIS_URL'" >>"$dir/env"
	else
		local port
		port=$(free_port)
		redis_bin >"$dir/redis.bin"
		echo "$port" >"$dir/redis.port"
		mkdir -p "$dir/redis"
		start_redis
		echo "export REDIS_URL='redis://127.0.0.1:$port/0'" >>"$dir/env"
	fi
	cat "$dir/env"
}

down() {
	[ -d "$dir" ] || return 0
	stop_redis
	stop_pg
	rm -rf "$dir"
}

case "$cmd" in
up) up ;;
down) down ;;
stop-pg) stop_pg ;;
start-pg) start_pg ;;
stop-redis) stop_redis ;;
start-redis) start_redis ;;
*) die "unknown command $cmd" ;;
esac
