#!/usr/bin/env bash
# stack.sh brings up a throwaway PostgreSQL and Redis on free loopback ports, for
# tests, benchmarks and `make run`, and tears them down again.
#
#   scripts/stack.sh up DIR        start both (unless DATABASE_URL / REDIS_URL are set),
#                                  write DIR/env with DATABASE_URL and REDIS_URL
#   scripts/stack.sh down DIR      stop what `up` started and remove DIR
#   scripts/stack.sh up-cluster DIR   opt-in, after up: a 3-master Redis Cluster on loopback;
#                                  appends REDIS_CLUSTER_URL to DIR/env
#   scripts/stack.sh up-cluster2 DIR  opt-in, after up: a 2-master Redis Cluster (make bench's
#                                  capacity section); appends REDIS_CLUSTER2_URL
#   scripts/stack.sh up-tls DIR       opt-in, after up: a TLS-only Redis with a throwaway CA;
#                                  appends REDIS_TLS_URL, REDIS_TLS_CA, REDIS_TLS_WRONG_CA
#   scripts/stack.sh up-sentinel DIR  opt-in, after up: primary + replica + 3 Sentinels
#                                  (failover within seconds); appends REDIS_SENTINEL_URL
#                                  and REDIS_SENTINEL_PRIMARY_PIDFILE
#   scripts/stack.sh up-pgbouncer DIR opt-in, after up: PgBouncer in transaction pooling in
#                                  front of the PostgreSQL; appends PGBOUNCER_DATABASE_URL
#   scripts/stack.sh up-standbys DIR  opt-in, after up: two streaming standbys of the
#                                  PostgreSQL (pg_basebackup -R), the second replaying 3 s
#                                  late (recovery_min_apply_delay); appends DATABASE_READ_URLS
#                                  (both, space-separated), DATABASE_STANDBY_FAST_URL and
#                                  DATABASE_STANDBY_SLOW_URL; once made, starts those stopped
#   scripts/stack.sh down-standbys DIR  stops and removes both standbys, their replication
#                                  slots and their lines of DIR/env; up-standbys makes new ones
#   scripts/stack.sh up-failover DIR  a stack of its own, without Redis, for failover tests:
#                                  a PostgreSQL committing with synchronous_commit on and
#                                  standby 1, its synchronous standby; writes DIR/env with
#                                  DATABASE_URL, DATABASE_STANDBY_URL and
#                                  DATABASE_FAILOVER_URL (both hosts, target_session_attrs)
#   scripts/stack.sh stop-pg DIR | start-pg DIR | stop-redis DIR | start-redis DIR
#                                  stop or restart one server on the same port (fault tests)
#   scripts/stack.sh kill-pg DIR      stop the PostgreSQL at once (pg_ctl stop -m immediate)
#   scripts/stack.sh promote-standby DIR N  promote standby N (pg_ctl promote)
#   scripts/stack.sh add-standby DIR N      one more standby N, streaming asynchronously
#   scripts/stack.sh follow-standby DIR N M standby N streams from standby M, promoted
#   scripts/stack.sh stop-standby DIR N | start-standby DIR N
#                                  the same for standby N (1 fast, 2 slow)
#
# It installs redis-server and PostgreSQL with apt-get when they are missing, and runs
# PostgreSQL as the postgres user when invoked as root (PostgreSQL refuses to run as root).
# The servers are tuned for tests (no fsync); they are not for production data.
#
# For up, PG_SHARED_BUFFERS (128MB) is PostgreSQL's shared_buffers, and PG_HUGE_PAGES=on
# backs them with huge pages that up reserves in the kernel's pool (vm.nr_hugepages,
# as root) and down gives back; without it, or when the kernel has not the memory,
# PostgreSQL runs without (huge_pages off), whatever the machine reserved for others.
# make bench sets both as docs/scaling.md tells operators to; DIR/pg.hugepages says
# how many pages the stack holds.
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
		up_pg "synchronous_commit = off"
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

# up_pg SETTING... makes and starts the stack's PostgreSQL under DIR/pg with the test
# tuning and each SETTING (a postgresql.conf line), creates its keygate database and
# appends DATABASE_URL to DIR/env.
up_pg() {
	local bindir port
	bindir=$(pg_bindir)
	port=$(free_port)
	echo "$bindir" >"$dir/pg.bindir"
	echo "$port" >"$dir/pg.port"
	mkdir -p "$dir/pg"
	[ "$(id -u)" = 0 ] && chown postgres "$dir" "$dir/pg"
	chmod 700 "$dir/pg"
	as_pg "$bindir/initdb" -D "$dir/pg" -U keygate --auth=trust -E UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
	{
		printf '%s\n' "fsync = off" "full_page_writes = off" "max_connections = 300" "shared_buffers = ${PG_SHARED_BUFFERS:-128MB}"
		printf '%s\n' "$@"
	} >>"$dir/pg/postgresql.conf"
	local huge=off
	if [ "${PG_HUGE_PAGES:-off}" = on ] && reserve_huge_pages; then
		huge=on
	fi
	echo "huge_pages = $huge" | as_pg tee -a "$dir/pg/postgresql.conf" >/dev/null
	start_pg
	pg_admin "CREATE DATABASE keygate"
	echo "export DATABASE_URL='postgres://keygate@127.0.0.1:$port/keygate?sslmode=disable'" >>"$dir/env"
}

# reserve_huge_pages adds to the kernel's pool of huge pages as many as the stack's
# PostgreSQL needs for its shared memory, and writes their number to DIR/pg.hugepages
# for down to give back. It needs root, and fails, reserving nothing, when the kernel
# cannot find that many. Stacks reserving at once take turns (flock).
reserve_huge_pages() {
	local need before after
	[ "$(id -u)" = 0 ] || { echo "stack.sh: PG_HUGE_PAGES=on needs root to reserve huge pages; running without" >&2; return 1; }
	need=$(as_pg "$(cat "$dir/pg.bindir")/postgres" -D "$dir/pg" -C shared_memory_size_in_huge_pages)
	(
		flock 9
		before=$(cat /proc/sys/vm/nr_hugepages)
		sysctl -qw vm.nr_hugepages=$((before + need))
		after=$(cat /proc/sys/vm/nr_hugepages)
		if [ "$after" -lt $((before + need)) ]; then
			sysctl -qw vm.nr_hugepages="$before"
			echo "stack.sh: the kernel found $((after - before)) of the $need huge pages PostgreSQL needs; running without" >&2
			exit 1
		fi
	) 9>/tmp/keygate-stack-hugepages.lock || return 1
	echo "$need" >"$dir/pg.hugepages"
}

# release_huge_pages gives back the huge pages reserve_huge_pages reserved, once
# PostgreSQL has stopped.
release_huge_pages() {
	[ -f "$dir/pg.hugepages" ] || return 0
	(
		flock 9
		sysctl -qw vm.nr_hugepages=$(($(cat /proc/sys/vm/nr_hugepages) - $(cat "$dir/pg.hugepages")))
	) 9>/tmp/keygate-stack-hugepages.lock
	rm -f "$dir/pg.hugepages"
}

# start_extra_redis NAME PORT ARGS... starts one more redis-server under DIR/NAME,
# recording its pid file in DIR/extra.pids for down.
start_extra_redis() {
	local name=$1 port=$2
	shift 2
	mkdir -p "$dir/$name"
	"$(redis_bin)" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--daemonize yes --pidfile "$dir/$name/redis.pid" --logfile "$dir/$name/redis.log" \
		--dir "$dir/$name" --protected-mode no "$@"
	echo "$dir/$name/redis.pid" >>"$dir/extra.pids"
}

# start_cluster_node I starts cluster node I and prints its port. The port is taken
# from 20000..22767 so that it and its bus port (port + 10000) both lie below the
# kernel's ephemeral range (32768..): no outgoing connection can hold either. Redis
# listens on the port before it binds the bus port and exits if that fails, so the
# node counts as started only once its log says it is ready and it answers PING; a
# node that died is given up for another port.
start_cluster_node() {
	local i=$1 p try n
	for try in 1 2 3 4 5; do
		p=$(free_port 20000 2768)
		! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null || continue
		rm -rf "$dir/cluster$i"
		start_extra_redis "cluster$i" "$p" --cluster-enabled yes \
			--cluster-config-file "$dir/cluster$i/nodes.conf" --cluster-node-timeout 2000
		for n in $(seq 1 50); do
			if grep -q 'Ready to accept connections' "$dir/cluster$i/redis.log" 2>/dev/null &&
				[ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then
				echo "$p"
				return 0
			fi
			sleep 0.1
		done
		echo "stack.sh: cluster node $i did not start on $p (try $try): $(tail -n 1 "$dir/cluster$i/redis.log" 2>/dev/null)" >&2
		kill "$(cat "$dir/cluster$i/redis.pid" 2>/dev/null)" 2>/dev/null || true
	done
	die "cluster node $i did not start"
}

# up_cluster starts three cluster masters (ports at most 55535: the bus port is
# port + 10000) and joins them with redis-cli --cluster create.
up_cluster() {
	dir=$(cd "$dir" && pwd)
	local ports=() i
	for i in 1 2 3; do
		ports+=("$(start_cluster_node "$i")")
	done
	redis-cli --cluster create "127.0.0.1:${ports[0]}" "127.0.0.1:${ports[1]}" "127.0.0.1:${ports[2]}" \
		--cluster-replicas 0 --cluster-yes >"$dir/cluster-create.log" 2>&1 ||
		{ cat "$dir/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
	for i in $(seq 1 100); do
		if redis-cli -p "${ports[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
			echo "export REDIS_CLUSTER_URL='redis://127.0.0.1:${ports[0]}?addr=127.0.0.1:${ports[1]}&addr=127.0.0.1:${ports[2]}'" >>"$dir/env"
			return 0
		fi
		sleep 0.1
	done
	die "cluster did not reach cluster_state:ok"
}

# up_cluster2 starts two cluster masters, gives each half of the slots and has them
# meet: redis-cli --cluster create wants three masters at least.
up_cluster2() {
	dir=$(cd "$dir" && pwd)
	local a b i
	a=$(start_cluster_node 2-1)
	b=$(start_cluster_node 2-2)
	redis-cli -p "$a" cluster addslotsrange 0 8191 >/dev/null
	redis-cli -p "$b" cluster addslotsrange 8192 16383 >/dev/null
	redis-cli -p "$a" cluster meet 127.0.0.1 "$b" >/dev/null
	for i in $(seq 1 100); do
		if redis-cli -p "$a" cluster info 2>/dev/null | grep -q '^cluster_state:ok' &&
			redis-cli -p "$b" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
			echo "export REDIS_CLUSTER2_URL='redis://127.0.0.1:$a?addr=127.0.0.1:$b'" >>"$dir/env"
			return 0
		fi
		sleep 0.1
	done
	die "the 2-master cluster did not reach cluster_state:ok"
}

# up_tls makes a throwaway CA and a server certificate for 127.0.0.1, starts a
# TLS-only redis-server with them, and a second unrelated CA for wrong-CA tests.
up_tls() {
	dir=$(cd "$dir" && pwd)
	command -v openssl >/dev/null || apt_install openssl
	local t="$dir/tls" port
	mkdir -p "$t"
	(
		cd "$t"
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=keygate-test-ca \
			-keyout ca.key -out ca.pem
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=keygate-wrong-ca \
			-keyout wrong-ca.key -out wrong-ca.pem
		openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >ext.cnf
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
			-extfile ext.cnf -out server.pem
	) >"$dir/tls.log" 2>&1 || { cat "$dir/tls.log" >&2; die "openssl failed"; }
	port=$(free_port)
	start_extra_redis tlsredis 0 --tls-port "$port" --tls-cert-file "$t/server.pem" \
		--tls-key-file "$t/server.key" --tls-ca-cert-file "$t/ca.pem" --tls-auth-clients no
	wait_port "$port" "TLS redis"
	cat >>"$dir/env" <<-EOF
		export REDIS_TLS_URL='rediss://127.0.0.1:$port/0'
		export REDIS_TLS_CA='$t/ca.pem'
		export REDIS_TLS_WRONG_CA='$t/wrong-ca.pem'
	EOF
}

# up_sentinel starts a primary, a replica of it and three Sentinels watching it
# with a short down-after-milliseconds, so that a killed primary is replaced in seconds.
up_sentinel() {
	dir=$(cd "$dir" && pwd)
	local p r s i ports=()
	p=$(free_port)
	start_extra_redis sentinel-primary "$p"
	wait_port "$p" "sentinel primary"
	r=$(free_port)
	start_extra_redis sentinel-replica "$r" --replicaof 127.0.0.1 "$p"
	wait_port "$r" "sentinel replica"
	for i in 1 2 3; do
		s=$(free_port)
		ports+=("$s")
		mkdir -p "$dir/sentinel$i"
		cat >"$dir/sentinel$i/sentinel.conf" <<-EOF
			port $s
			bind 127.0.0.1
			protected-mode no
			daemonize yes
			pidfile $dir/sentinel$i/redis.pid
			logfile $dir/sentinel$i/redis.log
			dir $dir/sentinel$i
			sentinel monitor mymaster 127.0.0.1 $p 2
			sentinel down-after-milliseconds mymaster 1000
			sentinel failover-timeout mymaster 3000
		EOF
		"$(redis_bin)" "$dir/sentinel$i/sentinel.conf" --sentinel
		echo "$dir/sentinel$i/redis.pid" >>"$dir/extra.pids"
		wait_port "$s" "sentinel $i"
	done
	cat >>"$dir/env" <<-EOF
		export REDIS_SENTINEL_URL='redis://127.0.0.1:${ports[0]}?addr=127.0.0.1:${ports[1]}&addr=127.0.0.1:${ports[2]}&master_name=mymaster'
		export REDIS_SENTINEL_PRIMARY_PIDFILE='$dir/sentinel-primary/redis.pid'
	EOF
}

# up_pgbouncer puts PgBouncer (pool_mode transaction) in front of the stack's
# PostgreSQL, run as the postgres user when root (pgbouncer refuses root).
up_pgbouncer() {
	dir=$(cd "$dir" && pwd)
	command -v pgbouncer >/dev/null || apt_install pgbouncer
	local b="$dir/pgbouncer" port pgport
	pgport=$(cat "$dir/pg.port")
	port=$(free_port)
	mkdir -p "$b"
	echo '"keygate" ""' >"$b/users.txt"
	cat >"$b/pgbouncer.ini" <<-EOF
		[databases]
		* = host=127.0.0.1 port=$pgport user=keygate
		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $port
		unix_socket_dir =
		auth_type = trust
		auth_file = $b/users.txt
		pool_mode = transaction
		default_pool_size = 20
		max_client_conn = 500
		ignore_startup_parameters = extra_float_digits
		pidfile = $b/pgbouncer.pid
		logfile = $b/pgbouncer.log
	EOF
	[ "$(id -u)" = 0 ] && chown -R postgres "$b"
	as_pg pgbouncer -d "$b/pgbouncer.ini" >/dev/null
	wait_port "$port" pgbouncer
	echo "$b/pgbouncer.pid" >>"$dir/extra.pids"
	echo "export PGBOUNCER_DATABASE_URL='postgres://keygate@127.0.0.1:$port/keygate?sslmode=disable'" >>"$dir/env"
}

# pg_admin SQL... runs each SQL in turn on the stack's own PostgreSQL, in its postgres
# database, as its superuser keygate.
pg_admin() {
	local args=() sql
	for sql in "$@"; do
		args+=(-c "$sql")
	done
	as_pg "$(cat "$dir/pg.bindir")/psql" -h 127.0.0.1 -p "$(cat "$dir/pg.port")" -U keygate -d postgres -qAt \
		"${args[@]}" >/dev/null
}

# start_standby N starts standby N of up-standbys on its port, unless it runs.
start_standby() {
	local n=$1
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/standby$n" status >/dev/null 2>&1 && return 0
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/standby$n" -l "$dir/standby$n/log" -w -t 30 \
		-o "-p $(cat "$dir/standby$n.port") -c listen_addresses=127.0.0.1 -k $dir/standby$n" start >/dev/null
}

# stop_standby N stops standby N, if it runs.
stop_standby() {
	local n=$1
	[ -d "$dir/standby$n" ] || return 0
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/standby$n" -m fast -w stop >/dev/null 2>&1 || true
}

# up_standbys makes two standbys of the stack's PostgreSQL with pg_basebackup -R,
# which writes standby.signal and primary_conninfo. PostgreSQL 15's defaults already
# stream: wal_level replica, max_wal_senders 10, hot_standby on, and initdb --auth=trust
# lets a loopback replication connection in. Standby 2 applies each commit
# recovery_min_apply_delay late, so that a test can show the fence holding against a
# standby that lags. Each standby has a replication slot (-C -S): the primary keeps
# the WAL a stopped standby has yet to receive, however much the tests write
# meanwhile, so stop-standby and start-standby always resume streaming. The stack
# commits with synchronous_commit off, so a commit reaches the standbys only once the
# WAL writer writes it: wal_writer_delay goes from 200 ms to 10 ms, or every lookup
# after a write would wait that long for a standby.
up_standbys() {
	dir=$(cd "$dir" && pwd)
	[ -f "$dir/pg.bindir" ] || die "up-standbys needs the stack's own PostgreSQL"
	# Standbys already made are only started, if stopped: up-standbys may come twice.
	if [ -f "$dir/standby1.port" ] && [ -f "$dir/standby2.port" ]; then
		start_standby 1
		start_standby 2
		return 0
	fi
	pg_admin "ALTER SYSTEM SET wal_writer_delay = '10ms'" "SELECT pg_reload_conf()"
	make_standby 1
	make_standby 2 "recovery_min_apply_delay = '3s'"
	cat >>"$dir/env" <<-EOF
		export DATABASE_READ_URLS='$(standby_url 1) $(standby_url 2)'
		export DATABASE_STANDBY_FAST_URL='$(standby_url 1)'
		export DATABASE_STANDBY_SLOW_URL='$(standby_url 2)'
	EOF
}

# make_standby N SETTING... makes standby N of the stack's PostgreSQL under
# DIR/standbyN with pg_basebackup -R and its own replication slot, adds each SETTING
# to its postgresql.conf, and starts it. Its cluster_name is standbyN, which its WAL
# receiver gives the primary as its application_name.
make_standby() {
	local n=$1 port
	shift
	port=$(free_port)
	echo "$port" >"$dir/standby$n.port"
	as_pg "$(cat "$dir/pg.bindir")/pg_basebackup" -h 127.0.0.1 -p "$(cat "$dir/pg.port")" -U keygate \
		-D "$dir/standby$n" -R -X stream -C -S "standby$n" -c fast --no-sync >"$dir/standby$n.log" 2>&1 ||
		{ cat "$dir/standby$n.log" >&2; die "pg_basebackup of standby $n failed"; }
	chmod 700 "$dir/standby$n"
	# The primary's huge pages are its own (reserve_huge_pages): a standby takes what
	# the kernel has to spare.
	printf '%s\n' "cluster_name = 'standby$n'" "huge_pages = try" "$@" | as_pg tee -a "$dir/standby$n/postgresql.conf" >/dev/null
	start_standby "$n"
}

# standby_url N prints the URL of standby N's keygate database.
standby_url() { echo "postgres://keygate@127.0.0.1:$(cat "$dir/standby$1.port")/keygate?sslmode=disable"; }

# up_failover makes a stack of its own in DIR for the failover tests, without Redis: a
# PostgreSQL that commits with synchronous_commit on, and standby 1, its synchronous
# standby (synchronous_standby_names). A commit that waits for it waits for its WAL
# receiver to flush the commit's record; with the standby stopped, it waits until the
# standby is back. The standby is named synchronous only once it streams, since
# CREATE DATABASE would otherwise wait for it.
up_failover() {
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	: >"$dir/env"
	up_pg "synchronous_commit = on" "wal_writer_delay = 10ms"
	make_standby 1
	pg_admin "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" "SELECT pg_reload_conf()"
	local p s
	p=$(cat "$dir/pg.port")
	s=$(cat "$dir/standby1.port")
	cat >>"$dir/env" <<-EOF
		export DATABASE_STANDBY_URL='$(standby_url 1)'
		export DATABASE_FAILOVER_URL='postgres://keygate@127.0.0.1:$p,127.0.0.1:$s/keygate?sslmode=disable&target_session_attrs=read-write'
	EOF
	cat "$dir/env"
}

# kill_pg stops the stack's PostgreSQL at once, as a crash would: no shutdown
# checkpoint, and the standbys hear nothing more.
kill_pg() {
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/pg" -m immediate -w stop >/dev/null
}

# promote_standby N promotes standby N to a primary and waits until it takes writes.
promote_standby() {
	as_pg "$(cat "$dir/pg.bindir")/pg_ctl" -D "$dir/standby$1" -w -t 30 promote >/dev/null
}

# follow_standby N M points standby N at standby M, promoted, as a failover tool does:
# primary_conninfo names M, without a replication slot (M has none of N's), and a
# reload restarts the WAL receiver. recovery_target_timeline 'latest', the default,
# has N follow M's new timeline.
follow_standby() {
	local n=$1 m=$2
	as_pg "$(cat "$dir/pg.bindir")/psql" -h 127.0.0.1 -p "$(cat "$dir/standby$n.port")" -U keygate -d postgres -qAt \
		-c "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=$(cat "$dir/standby$m.port") user=keygate application_name=standby$n'" \
		-c "ALTER SYSTEM SET primary_slot_name = ''" -c "SELECT pg_reload_conf()" >/dev/null
}

# down_standbys stops and removes the standbys of up_standbys, drops their replication
# slots and takes their URLs out of DIR/env. A slot left behind would make the primary
# keep every byte of WAL written after it, for as long as the stack runs.
down_standbys() {
	dir=$(cd "$dir" && pwd)
	[ -f "$dir/pg.bindir" ] || die "down-standbys needs the stack's own PostgreSQL"
	stop_standby 1
	stop_standby 2
	pg_admin "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('standby1', 'standby2')"
	rm -rf "$dir"/standby[12] "$dir"/standby[12].port "$dir"/standby[12].log
	sed -i '/^export DATABASE_READ_URLS=/d; /^export DATABASE_STANDBY_FAST_URL=/d; /^export DATABASE_STANDBY_SLOW_URL=/d' "$dir/env"
}

# stop_extra stops every server up-cluster, up-cluster2, up-tls, up-sentinel and
# up-pgbouncer started.
stop_extra() {
	[ -f "$dir/extra.pids" ] || return 0
	local f pid
	while read -r f; do
		pid=$(cat "$f" 2>/dev/null) || continue # gone, or removed by its server as it stops
		kill "$pid" 2>/dev/null || true
	done <"$dir/extra.pids"
	sleep 0.3
}

down() {
	[ -d "$dir" ] || return 0
	stop_extra
	stop_redis
	stop_standby 1
	stop_standby 2
	stop_pg
	release_huge_pages
	rm -rf "$dir"
}

case "$cmd" in
up) up ;;
down) down ;;
up-cluster) up_cluster ;;
up-cluster2) up_cluster2 ;;
up-tls) up_tls ;;
up-pgbouncer) up_pgbouncer ;;
up-sentinel) up_sentinel ;;
up-standbys) up_standbys ;;
up-failover) up_failover ;;
kill-pg) kill_pg ;;
promote-standby) promote_standby "${3:?promote-standby DIR N}" ;;
add-standby) dir=$(cd "$dir" && pwd) && make_standby "${3:?add-standby DIR N}" ;;
follow-standby) follow_standby "${3:?follow-standby DIR N M}" "${4:?follow-standby DIR N M}" ;;
down-standbys) down_standbys ;;
stop-standby) stop_standby "${3:?stop-standby DIR N}" ;;
start-standby) start_standby "${3:?start-standby DIR N}" ;;
stop-pg) stop_pg ;;
start-pg) start_pg ;;
stop-redis) stop_redis ;;
start-redis) start_redis ;;
*) die "unknown command $cmd" ;;
esac
